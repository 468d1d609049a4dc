"""``dpda simulate``: both parties in one process on a benchmark pair or your own tables, and
its flags for the session terms (declared once, by ``SessionTerms``)."""

from __future__ import annotations

import argparse
import math
from enum import Enum
from typing import Any, Literal, get_args, get_origin

from dpda.dp.ledger import default_delta
from dpda.ot.references import REFERENCE_ROWS
from dpda.service.output import write_json


# ------------------------------------------------------------------------------ simulate
class SourceFiles(argparse.Action):
    """``--source-file``, as often as given: every path in ``source_files``, the first in
    ``source_file`` (the one-source job's)."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None) -> None:
        files = [*(getattr(namespace, "source_files", None) or []), values]
        namespace.source_files = files
        namespace.source_file = files[0]


def _simulate_data(args: argparse.Namespace) -> tuple[Any, Any, str, str, dict[str, Any]]:
    """(source, target table, representation, scaling, what the JSON names as the data)."""

    from dpda.data.loaders import Domain, load_domain, require_data_dir
    from dpda.data.preprocessing import DEFAULT_REPRESENTATION, DEFAULT_SCALING
    from dpda.data.tables import Table, align_columns, align_labels, check_classes, read_table
    from dpda.errors import ConfigError

    if args.source_file or args.target_file:
        if not (args.source_file and args.target_file):
            raise ConfigError("--source-file and --target-file go together")
        label = _column(args.label_column)
        src = read_table(args.source_file, label, id_column=args.id_column, name="source")
        k = src.x.shape[1]
        tgt = read_table(
            args.target_file, label, labels="optional", id_column=args.id_column, name="target"
        )
        if isinstance(label, int) and tgt.y is not None and tgt.x.shape[1] == k - 1:
            # a position: the target file may lack the label column, one column fewer
            tgt = read_table(args.target_file, None, id_column=args.id_column, name="target")
        check_classes(src, str(args.label_column))
        if args.source_files:  # every source's columns and classes as the first one's
            args.source_domains = {}
            for name, path in zip(args.sources, args.source_files, strict=True):
                more = read_table(path, label, id_column=args.id_column, name=f"source {name}")
                check_classes(more, str(args.label_column))
                more = align_labels(align_columns(more, src), src)
                args.source_domains[name] = Domain(
                    name, more.x, more.domain.labels(), src.domain.n_classes
                )
        tgt = align_columns(tgt, src)  # by header name: reordered, or refused naming them
        tgt = align_labels(tgt, src)  # names as the source's classes, for scoring
        rep, scaling = args.representation or "raw", args.scaling or "zscore"
        names: dict[str, Any] = {
            "dataset": None,  # your own files, not a benchmark
            "source": str(args.source_file),
            "target": str(args.target_file),
            "source_file": str(args.source_file),
            "target_file": str(args.target_file),
            "label_names": list(src.label_names) if src.label_names else None,
        }
        if args.source_files:
            pairs = zip(args.sources, args.source_files, strict=True)
            names["source_files"] = {n: str(p) for n, p in pairs}
        return src.domain, tgt, rep, scaling, names
    if not (args.dataset and args.source and args.target):
        raise ConfigError("give --source-file and --target-file, or --dataset, --source, --target")
    if args.sources and (args.target in args.sources or len(set(args.sources)) < len(args.sources)):
        raise ConfigError("--source: each source once, and none of them the --target")
    data_dir = require_data_dir(args.data_dir)
    if args.sources:
        args.source_domains = {x: load_domain(data_dir, args.dataset, x) for x in args.sources}
    s = load_domain(data_dir, args.dataset, args.sources[0] if args.sources else args.source)
    t = load_domain(data_dir, args.dataset, args.target)
    table = Table.of(t)
    rep = args.representation or DEFAULT_REPRESENTATION[args.dataset]
    scaling = args.scaling or DEFAULT_SCALING[args.dataset]
    names = {"dataset": args.dataset, "source": args.source, "target": args.target}
    return s, table, rep, scaling, names


def _column(text: str | None) -> str | int | None:
    if text is None:
        return None
    return int(text) if text.lstrip("-").isdigit() else text


def _pct(v: float | None) -> str:
    return "n/a (no target labels)" if v is None else f"{v:.2f}"


def _simulate_public_source(
    args: argparse.Namespace, src: Any, tgt: Any, rep: str, scaling: str, names: dict
) -> int:
    """``--setting public-source``: the source public, the target's rows the private data."""
    from pathlib import Path

    from dpda.data.tables import write_predictions
    from dpda.dp.ledger import check_delta
    from dpda.simulation import simulate_public_source

    delta = args.delta if args.delta is not None else default_delta(tgt.domain.x.shape[0])
    check_delta(delta, tgt.domain.x.shape[0], "--delta", "the target (its rows are private here)")
    out = simulate_public_source(src, tgt.domain, rep, scaling, args.epsilon, delta, args.seed)
    pred = out.pop("predictions_array")
    preds_path = args.predictions or (
        Path(args.json).with_suffix(".predictions.csv")
        if args.json not in (None, "-")
        else Path("predictions.csv")
    )
    written = write_predictions(preds_path, tgt.ids, pred)
    data = {**out, **names, "seed": args.seed, "predictions": str(written.resolve())}
    write_json(args, data)
    a = data["accuracy"]
    where = f"{args.source}→{args.target}" if not args.source_file else "rehearsal"
    print(
        f"{where} (public source, private target)  source-only {_pct(a['source_only'])}  "
        f"private reweighting {_pct(a['dpda'])}  without privacy "
        f"{_pct(a['non_private_reweighting'])}"
    )
    print(
        f"  the target's real job would charge ε {data['epsilon_spent']:.3f} of {args.epsilon} "
        f"(δ={delta:.3g}) on its own rows; nothing was charged: this runs in memory"
    )
    print(f"  predictions: {data['predictions']}")
    return 0


def _simulate_once(
    args: argparse.Namespace, src: Any, tgt: Any, rep: str, scaling: str, seed: int | None
) -> tuple[Any, Any, dict[str, Any]]:
    """One rehearsal at ``seed``: (the outcome, its terms, its JSON)."""
    from dpda.cli.flags import flag_error
    from dpda.dp.ledger import check_delta
    from dpda.errors import ConfigError
    from dpda.simulation import METHODS
    from dpda.target_party.view import adapt_config

    # several sources share the terms: δ small enough for the largest of them
    n = max(
        (d.x.shape[0] for d in args.source_domains.values()) if args.sources else [src.x.shape[0]]
    )
    delta = args.delta if args.delta is not None else default_delta(n)
    check_delta(delta, n, "--delta", "the source")
    label = "source" if args.source_file else f"{args.dataset}:{args.source}"
    terms = terms_from_args(args, label, delta)
    cfg = adapt_config(args, seed if seed is not None else 0)
    methods = METHODS if args.method == "all" else (args.method,)
    try:
        if args.sources:
            if methods != ("dpda",):
                raise ConfigError("--method: several sources run the dpda method only")
            out = _run_consortium(args, tgt, rep, scaling, seed, terms, cfg)
        else:
            out = _run_simulate(args, src, tgt, rep, scaling, seed, terms, cfg, methods)
    except (ValueError, ConfigError) as exc:  # a setting's error, named by its flag
        raise ConfigError(flag_error(str(exc), args)) from None
    return out, terms, out.to_json(terms)


def _run_consortium(
    args: argparse.Namespace,
    tgt: Any,
    rep: str,
    scaling: str,
    seed: int | None,
    terms: Any,
    cfg: Any,
) -> Any:
    from dpda.service.progress import Progress
    from dpda.simulation import simulate_consortium
    from dpda.target_party.view import resolve_scaling

    return simulate_consortium(
        args.source_domains, tgt.domain, terms, rep, cfg, seed,
        progress=Progress("releases"),
        scaling_mode=resolve_scaling(args.scaling or "auto", terms, scaling),
        baselines=True if getattr(args, "references", False) else None,
        reference_rows=getattr(args, "reference_rows", REFERENCE_ROWS),
    )  # fmt: skip


def _run_simulate(
    args: argparse.Namespace,
    src: Any,
    tgt: Any,
    rep: str,
    scaling: str,
    seed: int | None,
    terms: Any,
    cfg: Any,
    methods: tuple[str, ...],
) -> Any:
    from dpda.data.preprocessing import default_attribute_bound
    from dpda.service.progress import Progress
    from dpda.simulation import simulate
    from dpda.target_party.view import resolve_scaling

    return simulate(
        src,
        tgt.domain,
        terms,
        rep,
        cfg,
        seed,
        progress=Progress("releases"),
        scaling_mode=resolve_scaling(args.scaling or "auto", terms, scaling),
        methods=methods,
        pate_queries=args.pate_queries,
        pate_share=args.pate_share,
        attribute_bound=args.attribute_bound
        if args.attribute_bound is not None
        else default_attribute_bound(rep, src.x.shape[1]),
        target_epsilon=args.target_epsilon,
        target_row_clip=args.target_row_clip,
        target_row_queries=args.target_row_queries
        or ("synthetic" if args.target_epsilon is not None else "exact"),
        target_query_epsilon=args.target_query_epsilon,
        baselines=True if getattr(args, "references", False) else None,
        reference_rows=getattr(args, "reference_rows", REFERENCE_ROWS),
    )


def spread_of(accuracies: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Mean, standard deviation (population), min and max of every numeric value each arm's
    ``accuracy`` holds over the runs; an arm with no number (no target labels) is left out."""
    import numpy as np

    arms: dict[str, list[float]] = {}
    for acc in accuracies:
        for arm, v in acc.items():
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
                arms.setdefault(arm, []).append(float(v))
    return {
        arm: {
            "mean": float(np.mean(vs)),
            "std": float(np.std(vs)),
            "min": float(np.min(vs)),
            "max": float(np.max(vs)),
            "runs": len(vs),
        }
        for arm, vs in arms.items()
    }


def _source_names(paths: list[str]) -> list[str]:
    """Each source file's name in the report: its file name without the suffix, or the whole
    path where two stems are the same; a file given twice is refused."""
    from pathlib import Path

    from dpda.errors import ConfigError

    if len({str(Path(p).resolve()) for p in paths}) < len(paths):
        raise ConfigError("--source-file: each source file once")
    stems = [Path(p).stem for p in paths]
    return stems if len(set(stems)) == len(stems) else [str(p) for p in paths]


def cmd_simulate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dpda.data.preprocessing import check_representation
    from dpda.data.tables import write_predictions
    from dpda.errors import ConfigError

    # --source or --source-file given several times: one job over several sources
    # (``simulate_consortium``)
    given = args.source or []
    files = getattr(args, "source_files", None) or []
    args.source_files = list(files) if len(files) > 1 else None
    args.sources = list(given) if len(given) > 1 else None
    args.source = "+".join(given) if given else None
    if args.sources and (args.source_file or args.setting != "private-source"):
        raise ConfigError("--source: several sources rehearse a benchmark's private-source job")
    if args.source_files:
        if args.setting != "private-source":
            raise ConfigError("--source-file: several sources rehearse a private-source job")
        args.sources = _source_names(args.source_files)
        if args.write_configs:
            raise ConfigError(
                "--write-configs: writes one source's and the target's configs; a job over "
                "several sources takes [[sources]] in the target's config (docs/operations.md)"
            )
    src, tgt, rep, scaling, names = _simulate_data(args)
    check_representation(src.x, rep, "--representation")
    check_representation(tgt.x, rep, "--representation")
    if args.setting == "public-source":
        return _simulate_public_source(args, src, tgt, rep, scaling, names)
    if args.seeds is None:
        out, terms, data = _simulate_once(args, src, tgt, rep, scaling, args.seed)
    else:  # the same rehearsal at seeds s, s+1, …: the first run's outputs, every run's spread
        first = args.seed if args.seed is not None else 0
        seeds = list(range(first, first + args.seeds))
        out, terms, data = _simulate_once(args, src, tgt, rep, scaling, seeds[0])
        accuracies = [data["accuracy"]]
        for seed in seeds[1:]:
            accuracies.append(_simulate_once(args, src, tgt, rep, scaling, seed)[2]["accuracy"])
        data["seeds"] = seeds
        data["accuracy_by_seed"] = accuracies
        data["spread"] = spread_of(accuracies)
    delta = terms.delta
    preds_path = args.predictions or (
        Path(args.json).with_suffix(".predictions.csv")
        if args.json not in (None, "-")
        else Path("predictions.csv")
    )
    data.update({**names, "seed": data.get("seeds", [args.seed])[0]})
    # how the references' scaling was chosen: by the target's labels, or not at all
    data["baseline_scaling_by"] = "target labels" if tgt.y is not None else "default"
    label_names = names.get("label_names")
    written = write_predictions(
        preds_path, tgt.ids, out.dpda.predictions, tuple(label_names) if label_names else None
    )
    data["predictions"] = str(written.resolve())
    if args.write_configs:
        from dpda.cli.rehearsed import write_configs
        from dpda.target_party.view import resolve_scaling

        mode = resolve_scaling(args.scaling or "auto", terms, scaling)
        # the cells the rehearsal ran with (its own choice when the flag left them out)
        ran = terms.model_copy(update={"cells": data.get("cells") or terms.cells})
        configs = write_configs(args, ran, rep, mode, data["seed"], int(src.x.shape[1]))
        data["configs"] = {"source": str(configs[0]), "target": str(configs[1])}
    write_json(args, data)
    a = data["accuracy"]
    names_ = {"dpda": "DPDA", "pate": "PATE", "dpda_pate": "DPDA+PATE"}
    private = "  ".join(f"{names_[k]} {_pct(a[k])}" for k in names_ if k in a)
    where = f"{args.source}→{args.target}" if not args.source_file else "rehearsal"
    if "spread" in data:
        print(f"{where}, {len(data['seeds'])} seeds ({data['seeds'][0]}…{data['seeds'][-1]}):")
        for arm, st in data["spread"].items():
            print(
                f"  {arm:<24} {st['mean']:6.2f} ± {st['std']:.2f}  "
                f"(min {st['min']:.2f}, max {st['max']:.2f})"
            )
        if not data["spread"]:
            print("  no accuracies: the target has no labels to score against")
        print(f"  predictions and the figures below: seed {data['seeds'][0]}")
    else:
        logistic = (
            f" (logistic {_pct(a['source_only_logistic'])})" if "source_only_logistic" in a else ""
        )
        print(
            f"{where}  source-only {_pct(a['source_only'])}{logistic}  OTDA {_pct(a['otda'])}  "
            f"DP without adaptation {_pct(a.get('dp_no_adaptation'))}  {private}"
        )
    scored = tgt.y is not None
    refs = data.get("references") or {}
    if not refs.get("ran", True):
        print(
            f"  source-only and OTDA references {refs['why']} (--references); nothing was "
            "scored, so no scaling was chosen"
        )
    elif refs.get("method"):
        print(f"  OTDA reference: {refs['method']['otda']}")
    if data.get("baseline_scaling"):
        print(
            f"  source-only and OTDA: non-private, under the {data['baseline_scaling']} scaling "
            + (
                "(the better of z-score and uniform by the target's labels)"
                if scored
                else "(the default: nothing was scored, so no scaling was chosen)"
            )
        )
    if not scored:
        print(
            f"  no accuracy: the target file has no label column {args.label_column!r}; a "
            "target with one is scored (its labels are read only to score the rehearsal)"
        )
    ad = data.get("adaptation") or {}
    if ad.get("estimate"):
        est = ad["estimate"]
        print(
            f"  adapting helped? label-free estimate ({ad['estimate_method']}): DPDA "
            f"{est['dpda']:.3f}, without adaptation {est['dp_no_adaptation']:.3f}; "
            f"the job keeps {ad['kept']} (--keep {ad['rule']})"
            + (f": {_pct(ad['kept_accuracy'])}" if ad.get("kept_accuracy") is not None else "")
            + (" by the label-free choice below" if data.get("choice") else "")
        )
    ch = data.get("choice")
    if ch and ch.get("rule") == "vote":
        print(
            f"  label-free choice ({len(ch['arms'])} arms): the job keeps the {ch['kept']} "
            f"near the noisy counts"
            + (f": {_pct(a.get('kept'))}" if a.get("kept") is not None else "")
        )
    elif ch:
        kept = next(a for a in ch["arms"] if a["arm"] == ch["kept"])
        print(
            f"  label-free choice ({ch['criterion']}, {len(ch['arms'])} arms): the job keeps "
            f"{ch['kept']} (score "
            + ("undefined" if kept["score"] is None else f"{kept['score']:.3f}")
            + ")"
            + (f": {_pct(a.get('kept'))}" if a.get("kept") is not None else "")
        )
    if ch and ch.get("guard"):
        print(f"  collapse guard: {ch['guard']}")
    fc = data.get("forecast")
    if fc:
        print(
            f"  forecast: noise-to-signal of a {fc['per']} {fc['noise_to_signal']:.3f} "
            f"({fc['rows_per_class']:.0f} rows per class on average); "
            + (
                "noise-dominated: expect little better than chance. " + " ".join(fc["advice"])
                if fc["noise_dominated"]
                else f"under the noise-dominated line {fc['threshold']:g}"
            )
        )
    print(
        f"  the real job would charge ε {data['epsilon_spent']:.3f} of {terms.epsilon} "
        f"(δ={delta:.3g}); σ/w={data['sigma']:.4f}  ℓ={data['projection_dim']} "
        f"({terms.projection}); nothing was charged: the ledger here is in memory"
    )
    if (data.get("cells") or 1) > 1:
        print(
            f"  the release: {data['cells']} noisy points a class (cells), the source's rows per "
            "class leaving each precise enough at this noise"
        )
    if "epsilon_spent_by_source" in data:
        cons = data["consortium"]
        each = "  ".join(f"{k} {v:.3f}" for k, v in data["epsilon_spent_by_source"].items())
        print(f"  each source's own ε (of {terms.epsilon} each): {each}")
        for name, why in cons["missing"].items():
            print(f"  source {name} is missing from the job: {why}")
    if data["target_disclosures"] == "none":
        print("  the target sent nothing about its rows (a source-space release): its ε is 0")
    elif data["target_epsilon_spent"] is not None:
        print(
            f"  the target's own scaling{' and basis' if terms.projection == 'target-pca' else ''}"
            f" under DP: ε {data['target_epsilon_spent']:.3f} at δ={data['target_delta']:.3g} "
            "of its rows"
        )
    else:
        print("  the target's scaling and basis are exact here (--target-epsilon E: under DP)")
    print(f"  predictions: {data['predictions']}")
    if "configs" in data:
        print(
            f"  the deployment of this rehearsal: {data['configs']['source']} and "
            f"{data['configs']['target']} (fill in the lines marked FILL IN)"
        )
    print(f"  note: {data['caveat']}")
    return 0


# the session terms `dpda simulate` takes as flags: type, default and choices come from
# SessionTerms (the one declaration); tests/unit/cli/test_cli.py compares them
TERM_FLAGS = (
    "privacy_unit", "neighbouring", "projection", "projection_dim", "batch_size", "steps",
    "noise_multiplier", "histogram_noise_ratio", "max_steps", "histogram_share", "calibration",
    "clip_norm", "cells", "release", "pate_teachers", "pate_aggregator", "pate_space",
    "synthetic_points", "synthetic_rows_per_point", "sinkhorn_steps", "sinkhorn_reg",
    "sinkhorn_debias", "sinkhorn_learning_rate", "cost", "metric_share", "metric_dim",
    "metric_pairs", "metric_margin", "metric_clip", "metric_steps", "metric_learning_rate",
)  # fmt: skip
TERM_HELP = {
    "privacy_unit": "record (whole records, labels included) or attribute (opt-in: one feature "
    "value only; labels and membership are NOT protected)",
    "neighbouring": "replace-one (sizes are disclosed, so add-remove is refused by the source)",
    "projection_dim": "ℓ, the projected dimension",
    "batch_size": "Poisson minibatch size B (0: one whole-dataset release)",
    "steps": "minibatches (0: as many as ε allows, at most --max-steps)",
    "histogram_noise_ratio": "minibatch histogram σ_h/σ (0.5: the best with a calibrated σ)",
    "clip_norm": "record unit: the row norm bound C",
    "release": "default: prototypes (record unit), rows (attribute unit, Algorithm 2); "
    "sinkhorn-synthetic: DP-Sinkhorn synthetic points (record unit)",
    "pate_teachers": "PATE: number of teachers T",
    "cost": "OT ground cost: sqeuclidean in the projected space, or metric: a map W learned "
    "under DP from the source's labels (one more release, same session ε)",
    "pate_space": "PATE queries in the projection space, or raw (opt-in)",
}


def terms_from_args(args: argparse.Namespace, dataset: str, delta: float) -> Any:
    from pydantic import ValidationError

    from dpda.cli.flags import flag_error
    from dpda.errors import ConfigError
    from dpda.service.config import terms_of
    from dpda.terms import terms_error

    try:  # the flags name the terms as a [job] table does: the same builder
        return terms_of(argparse.Namespace(**{**vars(args), "dataset": dataset, "delta": delta}))
    except ValidationError as exc:
        raise ConfigError(flag_error(terms_error(exc), args)) from None


def _term_flag(p: argparse.ArgumentParser, name: str) -> None:
    """``--name`` for one session term, declared by SessionTerms: its type, default (``release``:
    none, the unit decides) and the choices of a Literal."""
    from dpda.terms import SessionTerms, term_default

    field = SessionTerms.model_fields[name]
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        choices: tuple[Any, ...] | None = tuple(m.value for m in annotation)
    elif get_origin(annotation) is Literal:
        choices = get_args(annotation)
    else:
        choices = None
    default = term_default(name)
    kind: Any = None if choices else field.annotation  # int or float
    text = TERM_HELP.get(name) or field.description or name.replace("_", " ")
    p.add_argument(
        "--" + name.replace("_", "-"),
        type=kind,
        choices=choices,
        default=default,
        help=text if default is None else f"{text} (default {default})",
    )


def add_terms_args(p: argparse.ArgumentParser) -> None:
    from dpda.service.config import TargetJob
    from dpda.terms import DEFAULT_EPSILON

    p.add_argument(
        "--epsilon",
        type=float,
        default=DEFAULT_EPSILON,
        help=f"privacy budget ε (default {DEFAULT_EPSILON:g})",
    )
    p.add_argument(
        "--delta",
        type=float,
        default=None,
        help="δ (default 1/(10·ns); the DPDA paper's 1/(1.2·ns) reproduces its numbers)",
    )
    for name in TERM_FLAGS:
        _term_flag(p, name)
    p.add_argument(
        "--attribute-bound",
        "--feature-bound",
        dest="attribute_bound",
        type=float,
        default=None,
        help="attribute unit: the simulated source policy's bound on one feature's change, in "
        "its per-row representation (default 1/√k for normalized rows, 1 for raw)",
    )
    job = TargetJob.model_fields  # the target's own settings: the same defaults as its config
    p.add_argument("--reg-e", type=float, default=job["reg_e"].default, help="entropic λe")
    p.add_argument("--reg-g", type=float, default=job["reg_g"].default, help="group-lasso λg")
    p.add_argument(
        "--classifier",
        choices=get_args(job["classifier"].annotation),
        default=job["classifier"].default,
        help="the classifier trained on the adapted source rows (default "
        f"{job['classifier'].default})",
    )
    p.add_argument(
        "--select",
        choices=get_args(job["select"].annotation),
        default=job["select"].default,
        help="circular: choose λe, λg without target labels on the releases (no budget); "
        "none: keep --reg-e and --reg-g",
    )
    p.add_argument(
        "--transport-step",
        type=float,
        default=job["transport_step"].default,
        help="aggregate releases: how far each class point moves toward its OT image "
        "(0: not at all, 1: the barycentric image)",
    )
    p.add_argument(
        "--refine",
        type=float,
        default=job["refine"].default,
        help="aggregate releases: then how far each class point moves toward the mean of the "
        "target rows it labels (one self-labelling step; 0: none)",
    )
    p.add_argument(
        "--keep",
        choices=get_args(job["keep"].annotation),
        default=job["keep"].default,
        help="the model the job keeps: dpda, or better: DPDA or the release without "
        "adaptation, whichever the label-free estimate scores higher",
    )
    p.add_argument(
        "--method",
        choices=["dpda", "pate", "dpda+pate", "all"],
        default="dpda",
        help="release channels; 'all' runs each as its own session at the same ε",
    )
    p.add_argument(
        "--pate-queries",
        type=int,
        default=job["pate_queries"].default,
        help="PATE: target rows to label",
    )
    p.add_argument(
        "--pate-share",
        type=float,
        default=job["pate_share"].default,
        help="dpda+pate: fraction of ε given to PATE answers",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="fix all randomness (default: CSPRNG-seeded noise)"
    )
