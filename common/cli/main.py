"""The ``dpda`` command line. Each subcommand imports what it needs lazily (fast ``--help``)."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from enum import Enum
from typing import Any, Literal, NoReturn, get_args, get_origin

from dpda.errors import DpdaError
from dpda.service.output import add_json_option, json_to_stdout, write_json


def _positive(text: str) -> float:
    """A finite number > 0, or argparse's own error naming the flag."""
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"{text!r}: need a finite number > 0")
    return v


def _count(text: str) -> int:
    """An integer ≥ 1, or argparse's own error naming the flag."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: need a whole number ≥ 1")
    return v


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    write_json(args, data)
    if not json_to_stdout(args):
        print(text)


# ------------------------------------------------------------------------------- privacy
def _cmd_privacy_sigma(args: argparse.Namespace) -> int:
    from dpda.dp.accounting import calibrate_sigma
    from dpda.dp.mechanisms import relation_factor

    sigma = calibrate_sigma(args.epsilon, args.delta, args.method)
    factor = relation_factor(args.relation)
    data = {
        "sigma": sigma,
        "method": args.method,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "neighbouring": args.relation,
        "sensitivity_factor": factor,
        "note": "one Gaussian release spending all of ε; a job splits ε between its "
        "channels (features, histogram, PATE): `dpda target plan --config target.toml` "
        "prints the job's own σ and charge",
    }
    _emit(
        args,
        data,
        f"σ = {sigma:.6g} per unit of L2 sensitivity for ONE Gaussian release spending all of "
        f"ε={args.epsilon} ({args.method}, δ={args.delta:g}); under {args.relation} the "
        f"sensitivity is ×{factor}, so noise std = {sigma * factor:.6g} × (add/remove "
        "sensitivity).\n  A job splits ε between features, histogram and PATE: for its own σ "
        "and charge run `dpda target plan --config target.toml`.",
    )
    return 0


def _cmd_privacy_epsilon(args: argparse.Namespace) -> int:
    from dpda.dp.accounting import revealed_sampled_epsilon, sampled_gaussian_epsilon

    if args.relation == "attribute":  # what the ledger charges for attribute-unit minibatches
        eps = revealed_sampled_epsilon(
            args.sigma, args.sampling_rate, args.steps, args.delta, accountant=args.accountant
        )
    else:
        _no_replace_sampled(args)
        eps = sampled_gaussian_epsilon(
            args.sigma, args.sampling_rate, args.steps, args.delta, args.accountant
        )
    _emit(
        args,
        {"epsilon": eps, "accountant": args.accountant, "relation": args.relation},
        f"ε = {eps:.6g} after {args.steps} Poisson-sampled Gaussian releases "
        f"(σ={args.sigma}, p={args.sampling_rate}, δ={args.delta:g}, {args.accountant}, "
        f"{_RELATION_NOTE[args.relation]})",
    )
    return 0


def _cmd_privacy_steps(args: argparse.Namespace) -> int:
    from dpda.dp.accounting import max_revealed_steps, max_sampled_gaussian_steps

    if args.relation == "attribute":
        steps = max_revealed_steps(
            args.sigma, args.sampling_rate, args.epsilon, args.delta, accountant=args.accountant
        )
    else:
        _no_replace_sampled(args)
        steps = max_sampled_gaussian_steps(
            args.sigma, args.sampling_rate, args.epsilon, args.delta, args.accountant
        )
    _emit(
        args,
        {"steps": steps, "accountant": args.accountant, "relation": args.relation},
        f"at most {steps} steps keep ε ≤ {args.epsilon} (σ={args.sigma}, "
        f"p={args.sampling_rate}, δ={args.delta:g}, {args.accountant}, "
        f"{_RELATION_NOTE[args.relation]})",
    )
    return 0


_RELATION_NOTE = {
    "attribute": "attribute relation: sampling is revealed, it amplifies δ, not ε",
    "add-remove": "add/remove with amplification: NOT what dpda charges for its minibatches",
}


def _cmd_privacy_pate(args: argparse.Namespace) -> int:
    from dpda.dp.pate import pate_epsilon
    from dpda.errors import ConfigError

    scale = args.gamma if args.aggregator == "lnmax" else args.sigma
    if scale is None:
        raise ConfigError(
            "--gamma is required for lnmax"
            if args.aggregator == "lnmax"
            else "--sigma is required for gnmax"
        )
    bound = args.bound or ("moments" if args.aggregator == "lnmax" else "rdp")
    eps = pate_epsilon(args.aggregator, scale, args.queries, args.delta, bound)
    name = "γ" if args.aggregator == "lnmax" else "σ"
    _emit(
        args,
        {"epsilon": eps, "bound": bound, "aggregator": args.aggregator},
        f"ε = {eps:.6g} for {args.queries} {args.aggregator.upper()} answers ({name}={scale}, "
        f"δ={args.delta:g}, {bound} bound, data-independent, one record moves one teacher)",
    )
    return 0


def _no_replace_sampled(args: argparse.Namespace) -> None:
    if args.relation == "replace-one":
        from dpda.errors import ConfigError

        raise ConfigError(
            "--relation replace-one: Poisson-sampled accounting is only available under "
            "add-remove in dp-accounting; dpda does not offer a replace-one bound for it"
        )


# ------------------------------------------------------------------------------ simulate
def _simulate_data(args: argparse.Namespace) -> tuple[Any, Any, str, str, dict[str, Any]]:
    """(source, target table, representation, scaling, what the JSON names as the data)."""

    from dpda.data.loaders import load_domain, require_data_dir
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
        tgt = align_columns(tgt, src)  # by header name: reordered, or refused naming them
        tgt = align_labels(tgt, src)  # names as the source's classes, for scoring
        rep, scaling = args.representation or "raw", args.scaling or "zscore"
        names = {
            "dataset": None,  # your own files, not a benchmark
            "source": str(args.source_file),
            "target": str(args.target_file),
            "source_file": str(args.source_file),
            "target_file": str(args.target_file),
            "label_names": list(src.label_names) if src.label_names else None,
        }
        return src.domain, tgt, rep, scaling, names
    if not (args.dataset and args.source and args.target):
        raise ConfigError("give --source-file and --target-file, or --dataset, --source, --target")
    data_dir = require_data_dir(args.data_dir)
    s = load_domain(data_dir, args.dataset, args.source)
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

    delta = args.delta if args.delta is not None else 1.0 / (10.0 * tgt.domain.x.shape[0])
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
    from dpda.data.preprocessing import default_attribute_bound
    from dpda.dp.ledger import check_delta
    from dpda.service.progress import Progress
    from dpda.simulation import METHODS, simulate
    from dpda.target_party.view import AdaptConfig, resolve_scaling

    delta = args.delta if args.delta is not None else 1.0 / (10.0 * src.x.shape[0])
    check_delta(delta, src.x.shape[0], "--delta", "the source")
    label = "source" if args.source_file else f"{args.dataset}:{args.source}"
    terms = _terms(args, label, delta)
    cfg = AdaptConfig(
        reg_e=args.reg_e,
        reg_g=args.reg_g,
        classifier=args.classifier,
        seed=seed if seed is not None else 0,
        select=args.select,
        transport_step=args.transport_step,
        refine=args.refine,
        keep=args.keep,
    )
    methods = METHODS if args.method == "all" else (args.method,)
    out = simulate(
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
    )
    return out, terms, out.to_json(terms)


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


def _cmd_simulate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from dpda.data.preprocessing import check_representation
    from dpda.data.tables import write_predictions

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
    label_names = names.get("label_names")
    written = write_predictions(
        preds_path, tgt.ids, out.dpda.predictions, tuple(label_names) if label_names else None
    )
    data["predictions"] = str(written.resolve())
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
        print(
            f"{where}  source-only {_pct(a['source_only'])}  OTDA {_pct(a['otda'])}  "
            f"DP without adaptation {_pct(a.get('dp_no_adaptation'))}  {private}"
        )
    if data.get("baseline_scaling"):
        print(
            f"  source-only and OTDA: non-private, under the {data['baseline_scaling']} scaling "
            "(the better of z-score and uniform by the target's labels, when it has them)"
        )
    ad = data.get("adaptation") or {}
    if ad.get("estimate"):
        est = ad["estimate"]
        print(
            f"  adapting helped? label-free estimate ({ad['estimate_method']}): DPDA "
            f"{est['dpda']:.3f}, without adaptation {est['dp_no_adaptation']:.3f}; "
            f"the job keeps {ad['kept']} (--keep {ad['rule']})"
            + (f": {_pct(ad['kept_accuracy'])}" if ad.get("kept_accuracy") is not None else "")
        )
    print(
        f"  the real job would charge ε {data['epsilon_spent']:.3f} of {terms.epsilon} "
        f"(δ={delta:.3g}); σ/w={data['sigma']:.4f}  ℓ={data['projection_dim']} "
        f"({terms.projection}); nothing was charged: the ledger here is in memory"
    )
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
    print(f"  note: {data['caveat']}")
    return 0


# the session terms `dpda simulate` takes as flags: type, default and choices come from
# SessionTerms (the one declaration); tests/unit/test_cli.py compares them
TERM_FLAGS = (
    "privacy_unit", "neighbouring", "projection", "projection_dim", "batch_size", "steps",
    "noise_multiplier", "histogram_noise_ratio", "max_steps", "histogram_share", "calibration",
    "clip_norm", "release", "pate_teachers", "pate_aggregator", "pate_space",
    "synthetic_points", "synthetic_rows_per_point", "sinkhorn_steps", "sinkhorn_reg",
    "sinkhorn_debias", "sinkhorn_learning_rate", "cost", "metric_share", "metric_dim",
    "metric_pairs", "metric_margin", "metric_clip", "metric_steps", "metric_learning_rate",
)  # fmt: skip
# flags without a default of their own: SessionTerms fills them in from the unit and the release
RELEASE_DEPENDENT_FLAGS = (
    "release", "histogram_share", "calibration", "projection", "projection_dim",
)  # fmt: skip
TERM_HELP = {
    "privacy_unit": "record (whole records, labels included) or attribute (opt-in: one feature "
    "value only; labels and membership are NOT protected)",
    "neighbouring": "replace-one (sizes are disclosed, so add-remove is refused by the source)",
    "projection_dim": "ℓ, the projected dimension",
    "batch_size": "Poisson minibatch size B (0: one whole-dataset release)",
    "steps": "minibatches (0: as many as ε allows, at most --max-steps)",
    "histogram_noise_ratio": "minibatch histogram σ_h/σ (0.5 measured best with a calibrated σ)",
    "clip_norm": "record unit: the row norm bound C",
    "release": "default: prototypes (record unit), rows (attribute unit, Algorithm 2); "
    "sinkhorn-synthetic: DP-Sinkhorn synthetic points (record unit)",
    "pate_teachers": "PATE: number of teachers T",
    "cost": "OT ground cost: sqeuclidean in the projected space, or metric: a map W learned "
    "under DP from the source's labels (one more release, same session ε)",
    "pate_space": "PATE queries in the projection space, or raw (opt-in)",
}


def _terms(args: argparse.Namespace, dataset: str, delta: float) -> Any:
    from pydantic import ValidationError

    from dpda.errors import ConfigError
    from dpda.terms import SessionTerms, terms_error

    data = {"dataset": dataset, "epsilon": args.epsilon, "delta": delta}
    data |= {name: getattr(args, name) for name in TERM_FLAGS}
    try:
        return SessionTerms.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(terms_error(exc)) from None


def _term_flag(p: argparse.ArgumentParser, name: str) -> None:
    """``--name`` for one session term, declared by SessionTerms: its type, default (``release``:
    none, the unit decides) and the choices of a Literal."""
    from dpda.terms import SessionTerms

    field = SessionTerms.model_fields[name]
    annotation = field.annotation
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        choices: tuple[Any, ...] | None = tuple(m.value for m in annotation)
    elif get_origin(annotation) is Literal:
        choices = get_args(annotation)
    else:
        choices = None
    default = None if name in RELEASE_DEPENDENT_FLAGS else field.default
    if isinstance(default, Enum):
        default = default.value
    kind: Any = None if choices else field.annotation  # int or float
    text = TERM_HELP.get(name) or field.description or name.replace("_", " ")
    p.add_argument(
        "--" + name.replace("_", "-"),
        type=kind,
        choices=choices,
        default=default,
        help=text if default is None else f"{text} (default {default})",
    )


def _add_terms_args(p: argparse.ArgumentParser) -> None:
    from dpda.service.config import TargetJob

    p.add_argument("--epsilon", type=float, default=8.0, help="privacy budget ε (default 8)")
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
        default="1nn",
        help="the classifier trained on the adapted source rows (default 1nn)",
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


# ---------------------------------------------------------------------------------- demo
def _cmd_demo(args: argparse.Namespace) -> int:
    from dpda.cli.demo import run_demo

    return run_demo(args)


class _Parser(argparse.ArgumentParser):
    """Errors in one line and a pointer to ``--help``, not the whole usage first."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="dpda",
        description="Differentially private domain adaptation across a privacy boundary.",
    )
    from dpda.version import __version__

    parser.add_argument("--version", action="version", version=f"dpda {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    # privacy planner
    pp = sub.add_parser("privacy", help="plan noise, ε and steps before releasing anything")
    psub = pp.add_subparsers(dest="privacy_command", required=True)
    s = psub.add_parser("sigma", help="noise multiplier for one Gaussian release at (ε, δ)")
    s.add_argument("--epsilon", type=float, required=True, help="ε the one release spends")
    s.add_argument("--delta", type=float, required=True, help="δ")
    s.add_argument(
        "--method",
        choices=["theorem2", "analytic", "exact"],
        default="theorem2",
        help="theorem2 (the DPDA paper's), analytic (Balle & Wang, less noise) or exact (the "
        "ledger's own accountant)",
    )
    s.set_defaults(func=_cmd_privacy_sigma)
    e = psub.add_parser("epsilon", help="ε of T Poisson-sampled Gaussian releases")
    e.add_argument("--sigma", type=float, required=True, help="noise multiplier σ")
    e.add_argument(
        "--sampling-rate", type=float, required=True, help="Poisson sampling rate p = B/n"
    )
    e.add_argument("--steps", type=int, required=True, help="Poisson-sampled releases T")
    e.add_argument("--delta", type=float, required=True, help="δ")
    e.set_defaults(func=_cmd_privacy_epsilon)
    t = psub.add_parser("steps", help="largest T whose ε stays within a target")
    t.add_argument("--sigma", type=float, required=True, help="noise multiplier σ")
    t.add_argument(
        "--sampling-rate", type=float, required=True, help="Poisson sampling rate p = B/n"
    )
    t.add_argument("--epsilon", type=float, required=True, help="the ε to stay within")
    t.add_argument("--delta", type=float, required=True, help="δ")
    t.set_defaults(func=_cmd_privacy_steps)
    pt = psub.add_parser("pate", help="ε of PATE answers (data-independent bound)")
    pt.add_argument(
        "--aggregator",
        choices=["lnmax", "gnmax"],
        required=True,
        help="lnmax (Laplace noise) or gnmax (Gaussian noise)",
    )
    pt.add_argument("--gamma", type=float, default=None, help="LNMax: Laplace noise 1/γ")
    pt.add_argument("--sigma", type=float, default=None, help="GNMax: Gaussian noise σ")
    pt.add_argument("--queries", type=int, required=True, help="answers released")
    pt.add_argument("--delta", type=float, required=True, help="δ")
    pt.add_argument(
        "--bound",
        choices=["moments", "rdp", "pld"],
        default=None,
        help="default: moments for lnmax (the 2017 paper), rdp for gnmax",
    )
    add_json_option(pt)
    pt.set_defaults(func=_cmd_privacy_pate)
    # one flag for the neighbouring relation (``--neighbouring``: the same flag's other name)
    s.add_argument(
        "--relation",
        "--neighbouring",
        dest="relation",
        choices=["add-remove", "replace-one"],
        default="add-remove",
        help="the neighbouring relation: add-remove (default), or replace-one (every "
        "sensitivity doubles)",
    )
    for q in (e, t):
        q.add_argument(
            "--relation",
            "--neighbouring",
            dest="relation",
            choices=["attribute", "add-remove", "replace-one"],
            default="attribute",
            help="the neighbouring relation: attribute (default), the exact revealed-sampling "
            "charge dpda's attribute-unit minibatches get; add-remove: the amplified bound (for "
            "comparison only); replace-one: refused (no bound for it in dp-accounting)",
        )
        q.add_argument(
            "--accountant",
            choices=["pld", "rdp"],
            default="pld",
            help="privacy loss distributions (default, tight) or Rényi DP",
        )
    for q in (s, e, t):
        add_json_option(q)

    # simulate
    sm = sub.add_parser("simulate", help="run source-only, OTDA and DPDA in one process")
    sm.add_argument("--source-file", help="your labeled source table (.csv .parquet .npy .npz)")
    sm.add_argument("--target-file", help="your target table; its labels, if any, only score")
    sm.add_argument(
        "--label-column", default="-1", help="the label column: a name or a position (-1: last)"
    )
    sm.add_argument("--id-column", default=None, help="a column that names rows (not a feature)")
    sm.add_argument("--predictions", default=None, help="where to write the DPDA predictions")
    sm.add_argument(
        "--representation",
        choices=["raw", "sqrt", "rownorm", "l2"],
        default=None,
        help="per-row transform before scaling: raw (default for your own files), sqrt, "
        "rownorm or l2 (rows of norm 1)",
    )
    sm.add_argument(
        "--scaling",
        choices=["auto", "zscore", "uniform"],
        default=None,
        help="the target's column scaling of its OT space: auto (default) is uniform for "
        "source-space releases (their noise is the same in every direction of the source's "
        "space) and the dataset's own (z-score for your tables) otherwise",
    )
    sm.add_argument("--data-dir", default=None, help="benchmark data (default $DPDA_DATA)")
    sm.add_argument(
        "--dataset",
        choices=["office-caltech", "mnist-usps"],
        help="a benchmark instead of your own files",
    )
    sm.add_argument("--source", help="benchmark domain letter (A C D W / M U)")
    sm.add_argument("--target", help="benchmark domain letter (A C D W / M U)")
    sm.add_argument(
        "--setting",
        choices=["private-source", "public-source"],
        default="private-source",
        help="private-source (default): the labeled source is private (DPDA); public-source: "
        "the source is public and the target's rows are private (private "
        "reweighting; takes --epsilon, --delta (default 1/(10·nt)) and --seed only)",
    )
    sm.add_argument(
        "--seeds",
        type=_count,
        default=None,
        metavar="N",
        help="run the rehearsal N times, at seeds --seed (default 0) to --seed + N - 1, and "
        "print each arm's mean ± standard deviation (min, max); the JSON gains 'spread'",
    )
    sm.add_argument(
        "--target-epsilon",
        type=_positive,
        default=None,
        help="release the target's own column scaling and target-pca basis under DP at this ε "
        "(its rows, δ = 1/(10·nt)); the JSON gains target_epsilon_spent. Default: exact",
    )
    sm.add_argument(
        "--target-row-clip",
        type=_positive,
        default=None,
        help="with --target-epsilon: the target rows' norm bound in the per-row representation "
        "(default 1 for sqrt, l2, rownorm; required for raw)",
    )
    sm.add_argument(
        "--target-row-queries",
        choices=["synthetic", "dp", "exact"],
        default=None,
        help="what PATE sends the teachers about the target's rows (the target's [privacy] "
        "row_queries): synthetic points from its DP statistics, dp: random rows clipped and "
        "noised at --target-query-epsilon (needs --target-epsilon), exact: the rows. Default: "
        "synthetic with --target-epsilon, else exact",
    )
    sm.add_argument(
        "--target-query-epsilon",
        type=_positive,
        default=4.0,
        help="with --target-row-queries dp: ε of the noisy rows (added to target_epsilon_spent)",
    )
    _add_terms_args(sm)
    add_json_option(sm)
    sm.set_defaults(func=_cmd_simulate)

    # demo
    dm = sub.add_parser("demo", help="zero-setup run on generated data")
    dm.add_argument("--workdir", default=None, help="keep state here (default: a temp dir)")
    add_json_option(dm)
    dm.add_argument(
        "--epsilon", type=float, default=4.0, help="the session's privacy budget ε (default 4)"
    )
    dm.add_argument(
        "--in-process",
        action="store_true",
        help="skip the daemons and run the pipeline in one process",
    )
    dm.add_argument(
        "--setting",
        choices=["private-source", "public-source"],
        default="private-source",
        help="public-source: the reverse deployment (the daemon holds private unlabeled rows, "
        "the job public labeled ones)",
    )
    dm.set_defaults(func=_cmd_demo)

    from dpda.bench import service as bench
    from dpda.cli import service as cli_service

    cli_service.register(sub)
    bench.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if json_to_stdout(args):  # standard output carries the JSON alone; the rest goes to stderr
        args.json_stream = sys.stdout
        with contextlib.redirect_stdout(sys.stderr):
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except DpdaError as exc:
        print(f"dpda: error: {exc}", file=sys.stderr)
        return 2
    except (FileNotFoundError, ValueError) as exc:
        print(f"dpda: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
