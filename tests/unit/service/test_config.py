from __future__ import annotations

from pathlib import Path

import pytest

from dpda.errors import ConfigError
from dpda.service.config import load_source, load_target

DEPLOY = Path(__file__).resolve().parents[3] / "deploy"


def test_example_configs_validate() -> None:
    src = load_source(DEPLOY / "source.example.toml")
    tgt = load_target(DEPLOY / "target.example.toml")
    assert src.datasets[0].epsilon == 8.0 and src.peers[0].epsilon_cap == 8.0
    assert tgt.job.delta == src.datasets[0].delta


@pytest.mark.parametrize(
    "edit,field",
    [
        (
            ("epsilon = 8.0                             # cap", "epsilon = -1 # cap"),
            "datasets.0.epsilon",
        ),
        (("listen =", "lisen ="), "lisen"),
        (('kind = "synthetic"', 'kind = "excel"'), "datasets.0.kind"),
    ],
)
def test_config_errors_name_the_field(tmp_path, edit, field: str) -> None:
    text = (DEPLOY / "source.example.toml").read_text().replace(*edit)
    p = tmp_path / "s.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=field.replace(".", r"\.")):
        load_source(p)


def test_missing_and_broken_files(tmp_path) -> None:
    with pytest.raises(ConfigError, match="not found"):
        load_source(tmp_path / "nope.toml")
    (tmp_path / "b.toml").write_text("x = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_source(tmp_path / "b.toml")


def test_simulate_terms_error_names_the_field() -> None:
    import pytest

    from dpda.cli.main import build_parser
    from dpda.cli.simulate import terms_from_args
    from dpda.errors import ConfigError

    argv = ["simulate", "--dataset", "office-caltech", "--source", "C", "--target", "A"]
    args = build_parser().parse_args([*argv, "--noise-multiplier", "0"])
    with pytest.raises(ConfigError, match=r"^--noise-multiplier: 0 \(calibrate to ε\) needs"):
        terms_from_args(args, "office-caltech:C", 1e-3)
    args = build_parser().parse_args(
        [*argv, "--batch-size", "128", "--steps", "9", "--noise-multiplier", "0"]
    )
    with pytest.raises(ConfigError, match=r"^--batch-size: aggregate releases are whole-dataset"):
        terms_from_args(args, "office-caltech:C", 1e-3)  # the default unit releases aggregates
    args = build_parser().parse_args(
        [*argv, "--batch-size", "128", "--steps", "9", "--noise-multiplier", "0"]
        + ["--privacy-unit", "attribute"]
    )
    assert terms_from_args(args, "office-caltech:C", 1e-3).steps == 9


def test_deploy_examples_load_with_the_default_policy() -> None:
    from pathlib import Path

    from dpda.service.config import load_source, load_target

    root = Path(__file__).resolve().parents[3] / "deploy"
    src = load_source(root / "source.example.toml")
    (ds,) = src.datasets
    assert ds.policy.units == ("record",) and "rows" not in ds.policy.releases
    job = load_target(root / "target.example.toml").job
    assert job.privacy_unit == "record" and job.delta == ds.delta


def test_attribute_unit_needs_the_explicit_opt_in() -> None:
    import pytest
    from pydantic import ValidationError

    from dpda.policy import PrivacyPolicy

    with pytest.raises(ValidationError, match="neither labels nor membership"):
        PrivacyPolicy(units=("attribute",))
    ok = PrivacyPolicy(units=("attribute",), attribute_unit_exposes_labels_and_membership=True)
    assert ok.units == ("attribute",)


def test_the_broken_rdp_ledger_option_is_gone(tmp_path) -> None:
    """Hardening item 8: with accountant = "rdp" whole-batch releases were always refused and
    the target aborted minibatch jobs ("charge differs"); the option is refused now, naming it."""
    import pytest

    from dpda.errors import ConfigError
    from dpda.service.config import load_source

    text = (
        'state_dir = "s"\nsigning_key = "k"\n[tls]\ncert = "c"\nkey = "k"\npeer_ca = "ca"\n'
        '[[datasets]]\nname = "d"\nkind = "synthetic"\nepsilon = 1.0\naccountant = "rdp"\n'
    )
    (tmp_path / "s.toml").write_text(text)
    with pytest.raises(ConfigError, match=r"datasets\.0\.accountant"):
        load_source(tmp_path / "s.toml")


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("noise_multiplier", "Infinity"),
        ("noise_multiplier", "1e300"),
        ("noise_multiplier", "NaN"),
        ("histogram_noise_ratio", "1e308"),
        ("clip_norm", "Infinity"),
        ("epsilon", "Infinity"),
    ],
)
def test_session_terms_refuse_non_finite_and_absurd_floats(field: str, value: str) -> None:
    """``noise_multiplier = Infinity`` parsed, and 1e300 overflowed the
    accountant's PLD inside the source's planner (INTERNAL); the terms now refuse both by name."""
    from dpda.terms import SessionTerms, terms_error

    text = f'{{"dataset": "x", "epsilon": 1.0, "delta": 1e-5, "{field}": {value}}}'
    with pytest.raises(ValueError) as info:
        SessionTerms.model_validate_json(text)
    assert terms_error(info.value).startswith(f"{field}:")


@pytest.mark.parametrize("bound", [1e308, float("inf"), 0.0])
def test_a_policys_attribute_bound_is_finite_and_bounded(bound: float) -> None:
    """``feature_bound = 1e308`` was charged, then failed with INTERNAL (the
    sensitivity overflowed after the ledger entry). The policy now refuses it by name."""
    from pydantic import ValidationError

    from dpda.policy import PrivacyPolicy

    with pytest.raises(ValidationError, match="attribute_bound"):
        PrivacyPolicy(attribute_bound=bound)


def test_reverse_deployment_example_configs_validate() -> None:
    holder = load_source(DEPLOY / "holder.example.toml")
    driver = load_target(DEPLOY / "driver.example.toml")
    assert holder.datasets[0].labeled is False and holder.datasets[0].policy.allow_reweighting
    assert driver.job.setting == "public-source" and driver.job.dataset == holder.datasets[0].name
    assert driver.job.delta == holder.datasets[0].delta


@pytest.mark.parametrize("value", ["nan", "inf", "-1e-300", "1e308", "-0.5", "1.5"])
@pytest.mark.parametrize("key", ["refine", "transport_step"])
def test_the_adaptation_steps_out_of_range_are_refused_naming_the_key(
    tmp_path, key: str, value: str
) -> None:
    text = (
        (DEPLOY / "target.example.toml")
        .read_text()
        .replace("[job]\n", f"[job]\n{key} = {value}\n", 1)
    )
    p = tmp_path / "t.toml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=rf"job\.{key}"):
        load_target(p)


def test_a_target_job_declares_its_terms_once_and_is_derived_one_way() -> None:
    """The [job] table's session terms are SessionTerms' fields (default, bounds; None where the
    unit and the release decide); a changed job is validated as a [job] table is; its terms come
    from one method, the method's channels included."""
    from pydantic import ValidationError

    from dpda.service.config import TERMS_OF_JOB, TargetJob
    from dpda.terms import RELEASE_DEPENDENT, SessionTerms, term_default

    job, terms = TargetJob.model_fields, SessionTerms.model_fields
    assert "pate_queries" not in TERMS_OF_JOB and len(TERMS_OF_JOB) >= 33
    for name in TERMS_OF_JOB:
        assert job[name].metadata == terms[name].metadata, name
        if name in ("dataset", "epsilon"):
            assert job[name].is_required() and terms[name].is_required()
        elif name == "delta":  # default: the δ the source publishes
            assert job[name].default is None
        else:
            default = job[name].default
            assert getattr(default, "value", default) == term_default(name), name
    assert all(job[name].default is None for name in RELEASE_DEPENDENT)

    base = TargetJob.model_validate(
        {"dataset": "d", "data_kind": "synthetic", "epsilon": 2.0, "delta": 1e-5}
    )
    assert base.terms() == SessionTerms(dataset="d", epsilon=2.0, delta=1e-5)
    both = base.with_changes(method="dpda+pate", pate_queries=30, pate_share=0.25)
    assert base.method == "dpda"  # a copy: the job it came from is unchanged
    got = both.terms()
    assert (got.pate_queries, got.pate_epsilon, got.dpda) == (30, 0.5, True)
    with pytest.raises(ValidationError, match="metric_clip"):
        base.with_changes(metric_clip=0.0)
    with pytest.raises(ValidationError, match="no_such_field"):
        base.with_changes(no_such_field=1)


# what a user of the examples must set: where things are (state, address, data) and what has
# no default; every other value of the examples is the default the rehearsal runs
_WHERE = {"listen", "data_path", "label_column", "id_column", "path", "domain"}


def _set_beyond_what_a_user_must(model, table: dict, where: str) -> list[str]:
    out = []
    for key, value in table.items():
        field = model.model_fields[key]
        if isinstance(value, dict):
            continue  # a table of its own, checked on its own
        if isinstance(value, list) and value and isinstance(value[0], dict):
            continue
        if not field.is_required() and key not in _WHERE:
            out.append(f"{where}{key}")
    return out


def test_the_example_configs_set_only_what_a_user_must() -> None:
    """The examples are the rehearsal's defaults: a user who copies them runs the job
    ``dpda simulate`` rehearses (no target-pca, z-score, [privacy] ε or clip of their own)."""
    import tomllib

    from dpda.policy import PrivacyPolicy, TargetPrivacyPolicy
    from dpda.service.config import (
        ComputeConfig,
        SourceConfig,
        SourceDataset,
        TargetConfig,
        TargetJob,
    )

    tgt = tomllib.loads((DEPLOY / "target.example.toml").read_text())
    src = tomllib.loads((DEPLOY / "source.example.toml").read_text())
    extra = _set_beyond_what_a_user_must(TargetConfig, tgt, "")
    extra += _set_beyond_what_a_user_must(TargetJob, tgt["job"], "job.")
    extra += _set_beyond_what_a_user_must(TargetPrivacyPolicy, tgt.get("privacy", {}), "privacy.")
    extra += _set_beyond_what_a_user_must(ComputeConfig, tgt.get("compute", {}), "compute.")
    extra += _set_beyond_what_a_user_must(SourceConfig, src, "")
    for ds in src["datasets"]:
        extra += _set_beyond_what_a_user_must(SourceDataset, ds, "datasets.")
        extra += _set_beyond_what_a_user_must(PrivacyPolicy, ds.get("policy", {}), "policy.")
    assert extra == []


def test_the_example_job_is_the_rehearsals_default_job() -> None:
    """The example target's session terms (δ as the source publishes it) are those of
    ``dpda simulate`` with no flag but the data, on the example source's dataset."""
    from dpda.cli.main import build_parser
    from dpda.cli.simulate import terms_from_args
    from dpda.dp.ledger import default_delta

    job = load_target(DEPLOY / "target.example.toml").job
    (ds,) = load_source(DEPLOY / "source.example.toml").datasets
    delta = ds.delta if ds.delta is not None else default_delta(ds.synthetic_rows[0])
    args = build_parser().parse_args(["simulate", "--source-file", "S", "--target-file", "T"])
    assert job.with_changes(delta=delta).terms() == terms_from_args(args, ds.name, delta)
    assert job.scaling == args.scaling or (job.scaling == "auto" and args.scaling is None)


def _with_sources(tmp_path, *names: str, own: str = "") -> Path:
    """The example target config with ``[[sources]]`` entries (relative paths, as a user
    writes them) and, optionally, the first source's name."""
    text = (DEPLOY / "target.example.toml").read_text()
    fp = "sha256:" + "ab" * 32
    more = "".join(
        f'\n[[sources]]\nname = "{n}"\naddress = "{n}.example:50051"\nfingerprint = "{fp}"\n'
        f'signing_public_key = "keys/{n}.signing.pub"\npeer_ca = "keys/{n}-ca.pem"\n'
        for n in names
    )
    p = tmp_path / "t.toml"
    p.write_text((f'source_name = "{own}"\n' if own else "") + text + more)
    return p


def test_a_job_over_several_sources_gives_each_its_own_pin_ca_and_state(tmp_path) -> None:
    cfg = load_target(_with_sources(tmp_path, "bank-b", "bank-c", own="bank-a"))
    each = cfg.each_source()
    assert list(each) == ["bank-a", "bank-b", "bank-c"]
    a, b = each["bank-a"], each["bank-b"]
    assert a.source_address == cfg.source_address and a.tls.peer_ca == cfg.tls.peer_ca
    assert b.source_address == "bank-b.example:50051"
    assert b.source_signing_public_key == (tmp_path / "keys/bank-b.signing.pub").resolve()
    assert b.tls.peer_ca == (tmp_path / "keys/bank-b-ca.pem").resolve()
    assert b.tls.cert == cfg.tls.cert  # the target's own identity, the same at every source
    assert {c.state_dir for c in each.values()} == {
        cfg.state_dir / "sources" / n for n in each
    }  # a ledger copy per source, never two sources' entries in one
    assert all(c.sources == [] for c in each.values())
    assert load_target(DEPLOY / "target.example.toml").each_source() == {}


def test_a_source_named_twice_is_refused_naming_the_field(tmp_path) -> None:
    with pytest.raises(ConfigError, match="sources: .*'bank-b' is given twice"):
        load_target(_with_sources(tmp_path, "bank-b", "bank-b"))
    with pytest.raises(ConfigError, match="given twice"):
        load_target(_with_sources(tmp_path, "source"))  # the first source's default name
    with pytest.raises(ConfigError, match=r"sources\.0\.name"):
        load_target(_with_sources(tmp_path, "bank b"))


def test_a_job_over_several_sources_reads_delta_from_the_first_that_answers(
    tmp_path, monkeypatch
) -> None:
    """A source that is down when the job starts does not stop it: δ comes from the next
    source that publishes one; when none answers, the error names each one and why."""
    import dpda.target_party.app as app
    from dpda.errors import SourceDropped

    each = load_target(_with_sources(tmp_path, "bank-b", "bank-c", own="bank-a")).each_source()
    asked: list[str] = []

    def describe(cfg):
        asked.append(cfg.source_address)
        if cfg.source_address != "bank-c.example:50051":
            raise SourceDropped("no answer")
        return cfg.model_copy(update={"job": cfg.job.with_changes(delta=1e-6)})

    monkeypatch.setattr(app, "with_source_delta", describe)
    got = app._consortium_delta(each)
    assert got.job.delta == 1e-6 and len(asked) == 3
    monkeypatch.setattr(app, "with_source_delta", lambda cfg: (_ for _ in ()).throw(
        SourceDropped("no answer")))  # fmt: skip
    with pytest.raises(ConfigError, match="job.delta: .*bank-a: SourceDropped.*bank-c"):
        app._consortium_delta(each)
