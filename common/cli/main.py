"""The ``dpda`` command line. Each subcommand imports what it needs lazily (fast ``--help``)."""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from typing import Any, NoReturn

from dpda.cli.simulate import SourceFiles, add_terms_args, cmd_simulate
from dpda.errors import DpdaError
from dpda.ot.references import REFERENCE_ROWS
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


def _whole(text: str) -> int:
    """An integer ≥ 0, or argparse's own error naming the flag."""
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: need a whole number ≥ 0")
    return v


def _emit(args: argparse.Namespace, data: dict[str, Any], text: str) -> None:
    write_json(args, data)
    if not json_to_stdout(args):
        print(text)


# ------------------------------------------------------------------------------- privacy
def _cmd_privacy_sigma(args: argparse.Namespace) -> int:
    from dpda.dp.calibration import calibrate_sigma
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
    from dpda.dp.calibration import StepsTooLarge, max_revealed_steps, max_sampled_gaussian_steps

    try:
        if args.relation == "attribute":
            steps = max_revealed_steps(
                args.sigma, args.sampling_rate, args.epsilon, args.delta, accountant=args.accountant
            )
        else:
            _no_replace_sampled(args)
            steps = max_sampled_gaussian_steps(
                args.sigma, args.sampling_rate, args.epsilon, args.delta, args.accountant
            )
    except StepsTooLarge as exc:
        # a lower bound, said as one: the count past it could not be computed, not refused
        _emit(
            args,
            {
                "steps": exc.at_least,
                "too_large_to_compute": exc.too_large,
                "accountant": args.accountant,
                "relation": args.relation,
            },
            f"at least {exc.at_least} steps keep ε ≤ {args.epsilon}; {exc.too_large} steps "
            "are too large to compute under the size bound, so the maximum is not known "
            f"(σ={args.sigma}, p={args.sampling_rate}, δ={args.delta:g}, {args.accountant})",
        )
        return 1
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
    t = psub.add_parser(
        "steps",
        help="largest T whose ε stays within a target (exit 1 with a lower bound when a count "
        "the search needs is too large to compute)",
    )
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
    sm.add_argument(
        "--source-file",
        action=SourceFiles,
        help="your labeled source table (.csv .parquet .npy .npz); several times: one job over "
        "several sources, each file a source with its own ledger (named by its file name)",
    )
    sm.add_argument(
        "--target-file",
        help="your target table; with a column named as --label-column (e.g. label) the "
        "rehearsal is scored against it (accuracies; the labels are read only to score)",
    )
    sm.add_argument(
        "--label-column", default="-1", help="the label column: a name or a position (-1: last)"
    )
    sm.add_argument("--id-column", default=None, help="a column that names rows (not a feature)")
    sm.add_argument(
        "--predictions",
        default=None,
        help="where to write the DPDA predictions (default: beside --json, else predictions.csv)",
    )
    sm.add_argument(
        "--write-configs",
        metavar="DIR",
        default=None,
        help="also write DIR/source.toml and DIR/target.toml: the deployment of this rehearsal "
        "(every choice it made; keys, fingerprints and the address to fill in)",
    )
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
    sm.add_argument(
        "--source",
        action="append",
        help="benchmark domain letter (A C D W / M U); given several times, one job over "
        "several private sources (a consortium: each source's ε its own; the JSON gains "
        "epsilon_spent_by_source)",
    )
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
    sm.add_argument(
        "--references",
        action="store_true",
        help="run the non-private references (source-only, OTDA) even when the target has no "
        "labels to score them (default: only when it has)",
    )
    sm.add_argument(
        "--reference-rows",
        type=_whole,
        default=REFERENCE_ROWS,
        metavar="N",
        help=f"the OTDA reference solves the exact problem on a uniform subsample of N rows a "
        f"side (default {REFERENCE_ROWS}; 0: every row, memory then grows as ns × nt)",
    )
    add_terms_args(sm)
    add_json_option(sm)
    sm.set_defaults(func=cmd_simulate)

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
        "--sources",
        type=int,
        choices=range(1, 9),
        default=1,
        metavar="N",
        help="N organizations' source daemons and one target job over all of them (2 to 8; "
        "default 1)",
    )
    dm.add_argument(
        "--setting",
        choices=["private-source", "public-source"],
        default="private-source",
        help="public-source: the daemon holds private unlabeled rows, the job public labeled ones",
    )
    dm.set_defaults(func=_cmd_demo)

    from dpda.cli import bench
    from dpda.cli import service as cli_service

    cli_service.register(sub)
    bench.register(sub)
    say_defaults(parser)
    return parser


def say_defaults(parser: argparse.ArgumentParser) -> None:
    """Every option whose default is a value says it in its help (``(default X)``), unless its
    help already speaks of its default: ``--help`` gives every default."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                say_defaults(sub)
            continue
        if not action.option_strings or action.help in (None, argparse.SUPPRESS):
            continue
        if isinstance(action, argparse._StoreTrueAction | argparse._HelpAction):
            continue
        d = action.default
        if d is None or d == argparse.SUPPRESS or d == [] or "default" in action.help:
            continue
        shown = " ".join(str(v) for v in d) if isinstance(d, list | tuple) else str(d)
        action.help = f"{action.help} (default {shown})"


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
