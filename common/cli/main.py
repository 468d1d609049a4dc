"""The ``dpda`` command line. Each subcommand imports what it needs lazily (fast ``--help``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

from dpda.errors import DpdaError
from dpda.service.output import add_json_option, json_to_stdout, write_json


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    write_json(args, data)
    if not json_to_stdout(args):
        print(text)


# ------------------------------------------------------------------------------- privacy
def _cmd_privacy_sigma(args: argparse.Namespace) -> int:
    from dpda.dp.accounting import calibrate_sigma
    from dpda.dp.mechanisms import relation_factor

    sigma = calibrate_sigma(args.epsilon, args.delta, args.method)
    factor = relation_factor(args.neighbouring)
    data = {
        "sigma": sigma,
        "method": args.method,
        "epsilon": args.epsilon,
        "delta": args.delta,
        "neighbouring": args.neighbouring,
        "sensitivity_factor": factor,
    }
    _emit(
        args,
        data,
        f"σ = {sigma:.6g} per unit of L2 sensitivity ({args.method}, ε={args.epsilon}, "
        f"δ={args.delta:g}); under {args.neighbouring} the sensitivity is ×{factor}, "
        f"so noise std = {sigma * factor:.6g} × (add/remove sensitivity)",
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
    if args.neighbouring == "replace-one":
        from dpda.errors import ConfigError

        raise ConfigError(
            "--neighbouring replace-one: Poisson-sampled accounting is only available under "
            "add-remove in dp-accounting; dpda does not offer a replace-one bound for it"
        )


# ------------------------------------------------------------------------------ simulate
def _cmd_simulate(args: argparse.Namespace) -> int:
    from dpda.data.loaders import load_domain, require_data_dir
    from dpda.data.preprocessing import (
        DEFAULT_REPRESENTATION,
        DEFAULT_SCALING,
        default_attribute_bound,
    )
    from dpda.service.progress import Progress
    from dpda.simulation import METHODS, simulate
    from dpda.target_party.pipeline import AdaptConfig

    data_dir = require_data_dir(args.data_dir)
    src = load_domain(data_dir, args.dataset, args.source)
    tgt = load_domain(data_dir, args.dataset, args.target)
    delta = args.delta if args.delta is not None else 1.0 / (10.0 * src.x.shape[0])
    terms = _terms(args, f"{args.dataset}:{args.source}", delta)
    cfg = AdaptConfig(
        reg_e=args.reg_e,
        reg_g=args.reg_g,
        classifier=args.classifier,
        seed=args.seed if args.seed is not None else 0,
    )
    rep = DEFAULT_REPRESENTATION[args.dataset]
    methods = METHODS if args.method == "all" else (args.method,)
    out = simulate(
        src,
        tgt,
        terms,
        rep,
        cfg,
        args.seed,
        progress=Progress("releases"),
        scaling_mode=DEFAULT_SCALING[args.dataset],
        methods=methods,
        pate_queries=args.pate_queries,
        pate_share=args.pate_share,
        attribute_bound=args.attribute_bound
        if args.attribute_bound is not None
        else default_attribute_bound(rep, src.x.shape[1]),
    )
    data = out.to_json(terms)
    data.update(
        {"dataset": args.dataset, "source": args.source, "target": args.target, "seed": args.seed}
    )
    write_json(args, data)
    a = data["accuracy"]
    names = {"dpda": "DPDA", "pate": "PATE", "dpda_pate": "DPDA+PATE"}
    private = "  ".join(f"{names[k]} {a[k]:.2f}" for k in names if k in a)
    print(
        f"{args.source}→{args.target}  source-only {a['source_only']:.2f}  "
        f"OTDA {a['otda']:.2f}  {private}  "
        f"ε spent {data['epsilon_spent']:.3f} of {terms.epsilon} (δ={delta:.3g})  "
        f"σ/w={data['sigma']:.4f}  ℓ={data['projection_dim']} ({terms.projection})"
    )
    print(f"  note: {data['caveat']}")
    return 0


def _terms(args: argparse.Namespace, dataset: str, delta: float):
    from pydantic import ValidationError

    from dpda.errors import ConfigError
    from dpda.terms import SessionTerms, terms_error

    try:
        return SessionTerms(
            dataset=dataset,
            epsilon=args.epsilon,
            delta=delta,
            privacy_unit=args.privacy_unit,
            neighbouring=args.neighbouring,
            projection=args.projection,
            projection_dim=args.projection_dim,
            batch_size=args.batch_size,
            steps=args.steps,
            noise_multiplier=args.noise_multiplier,
            histogram_noise_ratio=args.histogram_noise_ratio,
            calibration=args.calibration,
            clip_norm=args.clip_norm,
            release=args.release,
            pate_teachers=args.pate_teachers,
            pate_aggregator=args.pate_aggregator,
            pate_space=args.pate_space,
        )
    except ValidationError as exc:
        raise ConfigError(terms_error(exc)) from None


def _add_terms_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epsilon", type=float, default=8.0, help="privacy budget ε (default 8)")
    p.add_argument(
        "--delta",
        type=float,
        default=None,
        help="δ (default 1/(10·ns); the DPDA paper's 1/(1.2·ns) reproduces its numbers)",
    )
    p.add_argument(
        "--privacy-unit",
        choices=["attribute", "record"],
        default="record",
        help="record (default: whole records, labels included) or attribute (opt-in: one "
        "feature value only; labels and membership are NOT protected)",
    )
    p.add_argument(
        "--neighbouring",
        choices=["add-remove", "replace-one"],
        default="replace-one",
        help="replace-one (sizes are disclosed, so add-remove is refused by the source)",
    )
    p.add_argument("--projection", choices=["jl", "target-pca"], default="target-pca")
    p.add_argument("--projection-dim", type=int, default=50, help="ℓ (default 50)")
    p.add_argument(
        "--batch-size",
        type=int,
        default=0,
        help="Poisson minibatch size B (default 0: one whole-dataset release)",
    )
    p.add_argument(
        "--steps", type=int, default=0, help="minibatches (default 0: as many as ε allows, ≤ 64)"
    )
    p.add_argument(
        "--noise-multiplier",
        type=float,
        default=1.1,
        help="minibatch σ/w (default 1.1; 0: the smallest σ whose --steps batches spend ε)",
    )
    p.add_argument(
        "--histogram-noise-ratio",
        type=float,
        default=2.0,
        help="minibatch histogram σ_h/σ (default 2; 0.5 measured best with a calibrated σ)",
    )
    p.add_argument("--calibration", choices=["theorem2", "analytic"], default="theorem2")
    p.add_argument("--clip-norm", type=float, default=1.0, help="record unit: row norm bound C")
    p.add_argument(
        "--attribute-bound",
        "--feature-bound",
        dest="attribute_bound",
        type=float,
        default=None,
        help="attribute unit: the simulated source policy's bound on one feature's change, in "
        "its per-row representation (default 1/√k for normalized rows, 1 for raw)",
    )
    p.add_argument("--reg-e", type=float, default=0.02, help="entropic strength λe")
    p.add_argument("--reg-g", type=float, default=0.5, help="group-lasso strength λg")
    p.add_argument("--classifier", choices=["1nn", "logistic", "mlp"], default="1nn")
    p.add_argument(
        "--release",
        choices=["rows", "prototypes", "class-gaussians"],
        default=None,
        help="default: prototypes (record unit), rows (attribute unit, Algorithm 2)",
    )
    p.add_argument(
        "--method",
        choices=["dpda", "pate", "dpda+pate", "all"],
        default="dpda",
        help="release channels; 'all' runs each as its own session at the same ε",
    )
    p.add_argument("--pate-teachers", type=int, default=50, help="PATE: number of teachers T")
    p.add_argument("--pate-queries", type=int, default=100, help="PATE: target rows to label")
    p.add_argument("--pate-aggregator", choices=["lnmax", "gnmax"], default="gnmax")
    p.add_argument(
        "--pate-space",
        choices=["projected", "raw"],
        default="projected",
        help="PATE queries in the projection space (default) or raw (opt-in)",
    )
    p.add_argument(
        "--pate-share",
        type=float,
        default=0.25,
        help="dpda+pate: fraction of ε given to PATE answers",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="fix all randomness (default: CSPRNG-seeded noise)"
    )


# ---------------------------------------------------------------------------------- demo
def _cmd_demo(args: argparse.Namespace) -> int:
    from dpda.cli.demo import run_demo

    return run_demo(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dpda",
        description="Differentially private domain adaptation across a privacy boundary.",
    )
    from dpda import __version__

    parser.add_argument("--version", action="version", version=f"dpda {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    # privacy planner
    pp = sub.add_parser("privacy", help="plan noise, ε and steps before releasing anything")
    psub = pp.add_subparsers(dest="privacy_command", required=True)
    s = psub.add_parser("sigma", help="noise multiplier for one Gaussian release at (ε, δ)")
    s.add_argument("--epsilon", type=float, required=True)
    s.add_argument("--delta", type=float, required=True)
    s.add_argument("--method", choices=["theorem2", "analytic"], default="theorem2")
    s.set_defaults(func=_cmd_privacy_sigma)
    e = psub.add_parser("epsilon", help="ε of T Poisson-sampled Gaussian releases")
    e.add_argument("--sigma", type=float, required=True)
    e.add_argument("--sampling-rate", type=float, required=True)
    e.add_argument("--steps", type=int, required=True)
    e.add_argument("--delta", type=float, required=True)
    e.set_defaults(func=_cmd_privacy_epsilon)
    t = psub.add_parser("steps", help="largest T whose ε stays within a target")
    t.add_argument("--sigma", type=float, required=True)
    t.add_argument("--sampling-rate", type=float, required=True)
    t.add_argument("--epsilon", type=float, required=True)
    t.add_argument("--delta", type=float, required=True)
    t.set_defaults(func=_cmd_privacy_steps)
    pt = psub.add_parser("pate", help="ε of PATE answers (data-independent bound)")
    pt.add_argument("--aggregator", choices=["lnmax", "gnmax"], required=True)
    pt.add_argument("--gamma", type=float, default=None, help="LNMax: Laplace noise 1/γ")
    pt.add_argument("--sigma", type=float, default=None, help="GNMax: Gaussian noise σ")
    pt.add_argument("--queries", type=int, required=True)
    pt.add_argument("--delta", type=float, required=True)
    pt.add_argument(
        "--bound",
        choices=["moments", "rdp", "pld"],
        default=None,
        help="default: moments for lnmax (the 2017 paper), rdp for gnmax",
    )
    add_json_option(pt)
    pt.set_defaults(func=_cmd_privacy_pate)
    for q in (s, e, t):
        q.add_argument(
            "--neighbouring", choices=["add-remove", "replace-one"], default="add-remove"
        )
        add_json_option(q)
    for q in (e, t):
        q.add_argument(
            "--relation",
            choices=["attribute", "add-remove"],
            default="attribute",
            help="attribute (default): the exact revealed-sampling charge dpda's attribute-unit "
            "minibatches get; add-remove: the amplified bound (for comparison only)",
        )
        q.add_argument("--accountant", choices=["pld", "rdp"], default="pld")

    # simulate
    sm = sub.add_parser("simulate", help="run source-only, OTDA and DPDA in one process")
    sm.add_argument("--data-dir", default=None, help="benchmark data (default $DPDA_DATA)")
    sm.add_argument("--dataset", choices=["office-caltech", "mnist-usps"], required=True)
    sm.add_argument("--source", required=True, help="domain letter (A C D W / M U)")
    sm.add_argument("--target", required=True, help="domain letter (A C D W / M U)")
    _add_terms_args(sm)
    add_json_option(sm)
    sm.set_defaults(func=_cmd_simulate)

    # demo
    dm = sub.add_parser("demo", help="zero-setup run on generated data")
    dm.add_argument("--workdir", default=None, help="keep state here (default: a temp dir)")
    add_json_option(dm)
    dm.add_argument("--epsilon", type=float, default=4.0)
    dm.add_argument(
        "--in-process",
        action="store_true",
        help="skip the daemons and run the pipeline in one process",
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
