"""``dpda simulate --write-configs DIR``: the deployment of the job just rehearsed.

``DIR/source.toml`` holds the source's daemon with its dataset entry and the policy the
rehearsal ran under; ``DIR/target.toml`` the target's daemon with the job and its own
``[privacy]``. Every field of the declarations (``SourceDataset``, ``PrivacyPolicy``,
``TargetJob``, ``TargetPrivacyPolicy``) is written, each read by its name from what the
rehearsal resolved (its session terms, its flags, its files), so that a knob added to a
declaration and to ``simulate``'s flags under the same name is carried without a list here.
Both files are loaded back and the job's terms compared with the rehearsal's before anything
is written: a config that would not reproduce the rehearsal is never left behind.

What the rehearsal cannot know is written as a placeholder marked ``FILL IN``: the keys
(``FILL-IN-KEYS/``: the folder ``dpda keys init`` wrote for both organizations), the peers'
certificate fingerprints and the source's address. A rehearsal run at a fixed ``--seed``
writes that seed with ``insecure_testing = true`` on both sides (the same noise, so the same
predictions); a real deployment removes both lines.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dpda.errors import ConfigError

KEYS = "FILL-IN-KEYS"  # the placeholder for the folder `dpda keys init --out` wrote
NO_FINGERPRINT = "sha256:" + "0" * 64
SOURCE_ORG, TARGET_ORG = "source-org", "target-org"
SOURCE_LISTEN = "127.0.0.1:50051"
SOURCE_ADDRESS = "localhost:50051"


def _value(v: Any) -> str:
    from dpda.deployment import _toml_value

    return _toml_value(v)


def _lines(values: dict[str, Any], notes: dict[str, str] | None = None) -> str:
    notes = notes or {}
    out = []
    for k, v in values.items():
        if v is None:
            continue
        note = notes.get(k)
        out.append(f"{k} = {_value(v)}" + (f"  # {note}" if note else ""))
    return "\n".join(out) + "\n"


def _by_name(declared: Any, *sources: Any, given: dict[str, Any]) -> dict[str, Any]:
    """Every field of the pydantic model ``declared``: from ``given``, else the first of
    ``sources`` (objects or dicts) that has it by name; fields none has keep their default."""
    values: dict[str, Any] = {}
    for name in declared.model_fields:
        if name in given:
            values[name] = given[name]
            continue
        for src in sources:
            if isinstance(src, dict) and name in src:
                values[name] = src[name]
                break
            if not isinstance(src, dict) and hasattr(src, name):
                values[name] = getattr(src, name)
                break
    return values


def _seed_lines(seed: int | None, who: str) -> str:
    if seed is None:
        return ""
    return (
        f"# the rehearsal's --seed: {who}'s noise as in the rehearsal, so the same predictions.\n"
        "# INSECURE (every draw predictable): remove both lines for a real deployment.\n"
        f"seed = {seed}\ninsecure_testing = true\n"
    )


def _refuse_unwritable(args: argparse.Namespace) -> None:
    if args.setting == "public-source":
        raise ConfigError("--write-configs: writes private-source jobs only (not --setting)")
    if args.method == "all":
        raise ConfigError(
            "--write-configs: --method all rehearses three jobs; pick one: dpda, pate, dpda+pate"
        )


def data_entries(args: argparse.Namespace, rep: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the source's dataset entry, the target's job) fields naming the rehearsal's data."""
    from dpda.cli.simulate import _column

    if args.source_file:
        label = _column(args.label_column)
        src = {
            "kind": "table",
            "path": str(Path(args.source_file).resolve()),
            "label_column": label,
            "id_column": args.id_column,
        }
        tgt = {
            "data_kind": "table",
            "data_path": str(Path(args.target_file).resolve()),
            "label_column": label,
            "id_column": args.id_column,
        }
    else:
        from dpda.data.loaders import require_data_dir

        data = str(Path(require_data_dir(args.data_dir)).resolve())
        src = {"kind": args.dataset, "path": data, "domain": args.source}
        tgt = {"data_kind": args.dataset, "data_path": data, "domain": args.target}
    src["representation"] = rep
    tgt["representation"] = rep
    return src, tgt


def deployment_of(
    args: argparse.Namespace,
    terms: Any,
    rep: str,
    scaling_mode: str,
    seed: int | None,
    n_features: int,
) -> tuple[Any, Any]:
    """(the source's SourceConfig, the target's TargetConfig) of the rehearsed job, with the
    placeholders of the module docstring; both validated as the daemons read them."""
    from dpda.data.preprocessing import default_attribute_bound
    from dpda.policy import PrivacyPolicy, TargetPrivacyPolicy
    from dpda.service.config import (
        TERMS_OF_JOB,
        SourceConfig,
        SourceDataset,
        TargetConfig,
        TargetJob,
    )

    _refuse_unwritable(args)
    src_data, tgt_data = data_entries(args, rep)
    bound = args.attribute_bound
    if bound is None:
        bound = default_attribute_bound(rep, n_features)
    # the policy the rehearsal's in-process source ran under (simulate's own)
    policy = PrivacyPolicy.rehearsal(terms.privacy_unit, terms.release, bound)
    if terms.cost != "metric":  # the rehearsal allows it for anyone's asking; a daemon opts in
        policy = policy.model_copy(update={"allow_metric": False})
    dataset = SourceDataset.model_validate(
        _by_name(
            SourceDataset,
            given={
                **src_data,
                "name": terms.dataset,
                "epsilon": terms.epsilon,
                "delta": terms.delta,
                "policy": policy,
            },
        )
    )
    keys = Path(KEYS)
    source = SourceConfig.model_validate(
        {
            "state_dir": "source-state",
            "listen": SOURCE_LISTEN,
            "tls": {
                "cert": keys / f"{SOURCE_ORG}.pem",
                "key": keys / f"{SOURCE_ORG}.key",
                "peer_ca": keys / "ca" / "ca.pem",
            },
            "signing_key": keys / f"{SOURCE_ORG}.signing.key",
            "datasets": [dataset],
            "peers": [
                {
                    "name": TARGET_ORG,
                    "cert_fingerprint": NO_FINGERPRINT,
                    "signing_public_key": keys / f"{TARGET_ORG}.signing.pub",
                    "epsilon_cap": terms.epsilon,
                }
            ],
            **({"seed": seed, "insecure_testing": True} if seed is not None else {}),
        }
    )
    job_given = {
        **tgt_data,
        "dataset": terms.dataset,
        "scaling": scaling_mode,
        "predictions": None,  # not the rehearsal's file: the job writes its own folder
        "method": args.method,
    }
    # every field of the job: the resolved session terms first, then the flag of its name
    resolved = {n: getattr(terms, n) for n in TERMS_OF_JOB}
    job = TargetJob.model_validate(_by_name(TargetJob, resolved, vars(args), given=job_given))
    privacy = TargetPrivacyPolicy.model_validate(_target_privacy(args, terms))
    target = TargetConfig.model_validate(
        {
            "state_dir": "target-state",
            "source_address": SOURCE_ADDRESS,
            "source_fingerprint": NO_FINGERPRINT,
            "source_signing_public_key": keys / f"{SOURCE_ORG}.signing.pub",
            "tls": {
                "cert": keys / f"{TARGET_ORG}.pem",
                "key": keys / f"{TARGET_ORG}.key",
                "peer_ca": keys / "ca" / "ca.pem",
            },
            "signing_key": keys / f"{TARGET_ORG}.signing.key",
            "budget_epsilon": terms.epsilon,
            "job": job,
            "privacy": privacy,
            **({"seed": seed, "insecure_testing": True} if seed is not None else {}),
        }
    )
    return source, target


def _target_privacy(args: argparse.Namespace, terms: Any) -> dict[str, Any]:
    """The target's ``[privacy]`` as the rehearsal ran it: each field from the flag
    ``--target-<field>``; disclosures under DP when ``--target-epsilon`` was given, exact (as
    the rehearsal computed them) otherwise; the cap room for this job's disclosures."""
    from dpda.policy import TargetPrivacyPolicy

    flags = {k[len("target_") :]: v for k, v in vars(args).items() if k.startswith("target_")}
    flags = {k: v for k, v in flags.items() if v is not None}
    dp = args.target_epsilon is not None
    values = _by_name(TargetPrivacyPolicy, flags, given={})
    values["disclosures"] = "dp" if dp or terms.source_space else "exact"
    if args.method != "dpda":  # what PATE sent about the target's rows in the rehearsal
        values.setdefault("row_queries", "synthetic" if dp else "exact")
    if dp:
        spend = args.target_epsilon + (
            values.get("query_epsilon", 4.0) if values.get("row_queries") == "dp" else 0.0
        )
        cap = TargetPrivacyPolicy.model_fields["epsilon_cap"].default
        values["epsilon_cap"] = max(cap, spend)
    return values


def _dump(model: Any) -> dict[str, Any]:
    return model.model_dump(mode="json", exclude_none=True)


PLACEHOLDER_NOTE = "FILL IN"
SEED_FIELDS = ("seed", "insecure_testing")  # written by _seed_lines, with their warning


def source_text(cfg: Any) -> str:
    d = _dump(cfg)
    head = (
        "# The source's side of the job `dpda simulate` rehearsed (written by --write-configs).\n"
        f"# FILL IN: {KEYS}/ is the folder of your keys: `dpda keys init --org {SOURCE_ORG} --out"
        f" KEYS`\n# and `dpda keys init --org {TARGET_ORG} --out KEYS --ca KEYS/ca` (one CA) or"
        " each organization's own;\n# the peer's fingerprint is the one its `keys init` printed."
        " Relative paths: from this file.\n"
    )
    top: dict[str, Any] = {k: d[k] for k in ("state_dir", "listen", "signing_key") if k in d}
    rest = {
        k: v
        for k, v in d.items()
        if k not in (*top, "tls", "datasets", "peers", "admin", "limits", *SEED_FIELDS)
    }
    text = head + _lines(top, {"signing_key": PLACEHOLDER_NOTE}) + _lines(rest)
    text += _seed_lines(cfg.seed, "the source")
    text += "\n[tls]\n" + _lines(d["tls"], dict.fromkeys(d["tls"], PLACEHOLDER_NOTE))
    for ds in d["datasets"]:
        policy = ds.pop("policy")
        text += "\n[[datasets]]\n" + _lines(ds)
        text += "\n[datasets.policy]  # the policy the rehearsal ran under\n" + _lines(policy)
    for peer in d["peers"]:
        text += "\n[[peers]]\n" + _lines(
            peer,
            {
                "cert_fingerprint": f"{PLACEHOLDER_NOTE}: the target's",
                "signing_public_key": PLACEHOLDER_NOTE,
            },
        )
    return text


def target_text(cfg: Any) -> str:
    d = _dump(cfg)
    head = (
        "# The target's side of the job `dpda simulate` rehearsed (written by --write-configs).\n"
        f"# FILL IN: {KEYS}/ (see source.toml), the source's fingerprint and its address.\n"
        "# Relative paths: from this file.\n"
    )
    top_names = (
        "state_dir", "source_address", "source_fingerprint", "source_signing_public_key",
        "signing_key", "budget_epsilon",
    )  # fmt: skip
    top: dict[str, Any] = {k: d[k] for k in top_names if k in d}
    notes = {
        "source_address": f"{PLACEHOLDER_NOTE}: the source's host:port",
        "source_fingerprint": f"{PLACEHOLDER_NOTE}: the source's",
        "source_signing_public_key": PLACEHOLDER_NOTE,
        "signing_key": PLACEHOLDER_NOTE,
    }
    text = head + _lines(top, notes) + _seed_lines(cfg.seed, "the target")
    text += "\n[tls]\n" + _lines(d["tls"], dict.fromkeys(d["tls"], PLACEHOLDER_NOTE))
    text += "\n[job]  # every choice of the rehearsal\n" + _lines(d["job"])
    text += "\n[privacy]  # the target's own rows, as the rehearsal treated them\n"
    text += _lines(d["privacy"])
    return text


def write_configs(
    args: argparse.Namespace,
    terms: Any,
    rep: str,
    scaling_mode: str,
    seed: int | None,
    n_features: int,
) -> tuple[Path, Path]:
    """Write ``source.toml`` and ``target.toml`` under ``args.write_configs``; each is read
    back as its daemon reads it and the job's terms checked equal to the rehearsal's first."""
    import tempfile

    from dpda.service.config import load_source, load_target
    from dpda.terms import method_terms

    source, target = deployment_of(args, terms, rep, scaling_mode, seed, n_features)
    texts = {"source.toml": source_text(source), "target.toml": target_text(target)}
    with tempfile.TemporaryDirectory() as tmp:  # read back before anything is written
        for name, text in texts.items():
            (Path(tmp) / name).write_text(text)
        job = load_target(Path(tmp) / "target.toml").job
        load_source(Path(tmp) / "source.toml")
    rehearsed = (
        terms
        if args.method == "dpda"
        else method_terms(terms, args.method, args.pate_queries, args.pate_share)
    )
    if job.terms() != rehearsed:
        raise ConfigError("--write-configs: the written job's terms differ from the rehearsal's")
    out = Path(args.write_configs)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in texts.items():
        (out / name).write_text(text)
        paths.append(out / name)
    return paths[0], paths[1]
