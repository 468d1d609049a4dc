"""``dpda bench public-source``: the public-source experiment (public labeled source, private
target).

Protocol (the paper's §7): d = 10, σ² = 1/(9d), 1,000 source rows (25%
P, 75% Q), n target rows from P (1,000 to 8,000), K = 1,000 optimisation steps, λ = 0.001,
δ = 1/8,000, ε varied, 10 repetitions. Methods: the two-stage algorithm with noisy Frank–Wolfe
(``noisy-fw``) or noisy mirror descent (``noisy-md``) for the weights, the single-stage
Frank–Wolfe method (``single-stage``), the public source alone (``public-only``) and ridge
regression on the labeled target (``oracle``, which no real target has). Reported per run: the
test MSE on fresh target rows and the discrepancy ‖M(q)‖₂ of the weights found. The target's
rows are clipped to r = 1 (a public rule; at these centres ‖t‖ ≈ 0.78) before anything reads
them. Every private method spends at most ε at δ under dp-accounting's RDP accountant.

This runs the mechanisms in one process (the data holder's side of the public-source deployment, not
yet the two daemons).
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from dpda.dp.discrepancy import PREDICTOR_RADIUS as LAMBDA_W
from dpda.dp.discrepancy import RIDGE, SMOOTHING
from dpda.dp.ledger import default_delta
from dpda.service.output import add_json_option, write_json
from tests.bench.harness import add_data_dir, add_pairs, add_seeds

TARGET_RADIUS = 1.0
METHODS = ("noisy-fw", "noisy-md", "single-stage", "public-only", "oracle")  # the JSON's rows


def _single_stage(
    xs: np.ndarray,
    ys: np.ndarray,
    moment: np.ndarray,
    epsilon: float,
    delta: float,
    steps: int,
    sens: float,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, float]:
    """Alternating Frank–Wolfe steps on q (private) and w (public), ``discrepancy.Reweighter``.
    Returns (q, w, ε spent)."""
    from dpda.dp import discrepancy as D

    opt = D.Reweighter(xs, "single-stage", y=ys, predictor_radius=LAMBDA_W)
    res = D.run_private(
        opt, moment, epsilon=epsilon, delta=delta, steps=steps, sensitivity=sens, rng=rng
    )
    return res.q, opt.w, res.epsilon


def run_once(
    n_target: int, epsilon: float, rep: int, steps: int, n_source: int = 1000, d: int = 10
) -> list[dict[str, Any]]:
    from dpda.data.synthetic import public_source_problem
    from dpda.dp import discrepancy as D

    xs, ys, xt, yt = public_source_problem(n_source, n_target, d, seed=rep)
    _, _, x_test, y_test = public_source_problem(10, 4000, d, seed=10_000 + rep)
    delta = 1.0 / 8000
    t_clipped = D.clip_rows_to(xt, TARGET_RADIUS)
    moment = D.second_moment(t_clipped)  # the data holder's only statistic of its rows
    radius = float(np.max(np.linalg.norm(xs, axis=1)))  # public
    sens = D.gradient_sensitivity(SMOOTHING, radius, TARGET_RADIUS, n_target)
    rng = np.random.default_rng(1000 * rep + 7)

    def mse(w: np.ndarray) -> float:
        return float(np.mean((x_test @ w - y_test) ** 2))

    out: list[dict[str, Any]] = []

    def row(method: str, q: np.ndarray | None, w: np.ndarray, spent: float | None) -> None:
        out.append(
            {
                "method": method,
                "epsilon": epsilon,
                "n_target": n_target,
                "repetition": rep,
                "mse": mse(w),
                "discrepancy": None if q is None else D.discrepancy(q, xs, moment),
                "epsilon_spent": spent,
            }
        )

    common = dict(
        epsilon=epsilon, delta=delta, steps=steps, mu=SMOOTHING, ridge=RIDGE, sensitivity=sens
    )
    fw = D.noisy_frank_wolfe(xs, moment, rng=rng, **common)  # type: ignore[arg-type]
    row("noisy-fw", fw.q, D.weighted_ridge(xs, ys, fw.q, RIDGE), fw.epsilon)
    md = D.noisy_mirror_descent(xs, moment, rng=rng, learning_rate=0.5, **common)  # type: ignore[arg-type]
    row("noisy-md", md.q, D.weighted_ridge(xs, ys, md.q, RIDGE), md.epsilon)
    q1, w1, spent1 = _single_stage(xs, ys, moment, epsilon, delta, steps, sens, rng)
    row("single-stage", q1, w1, spent1)
    uniform = np.full(n_source, 1.0 / n_source)
    row("public-only", uniform, D.weighted_ridge(xs, ys, uniform, RIDGE), None)
    oracle = np.full(n_target, 1.0 / n_target)
    row("oracle", None, D.weighted_ridge(xt, yt, oracle, RIDGE), None)
    return out


def classification_pair(data_dir: str, src: str, tgt: str, epsilon: float, seed: int) -> dict:
    """One benchmark pair in the public-source setting (``simulation.simulate_public_source``)."""
    from dpda.data.loaders import load_domain
    from dpda.data.preprocessing import DEFAULT_REPRESENTATION, DEFAULT_SCALING
    from dpda.simulation import simulate_public_source

    ds = "mnist-usps" if src in "MU" else "office-caltech"
    s, t = load_domain(data_dir, ds, src), load_domain(data_dir, ds, tgt)
    out = simulate_public_source(
        s,
        t,
        DEFAULT_REPRESENTATION[ds],
        DEFAULT_SCALING[ds],
        epsilon,
        default_delta(len(t.x)),
        seed,
    )
    rename = {"dpda": "private_reweighting"}
    return {
        "pair": f"{src}→{tgt}",
        "epsilon": epsilon,
        "seed": seed,
        "epsilon_spent": out["epsilon_spent"],
        "accuracy": {rename.get(k, k): v for k, v in out["accuracy"].items()},
        "discrepancy": {rename.get(k, k): v for k, v in out["discrepancy"].items()},
    }


def _mean(rows: list[dict[str, Any]], key: str, method: str, eps: float, n: int) -> float:
    vals = [r[key] for r in rows if (r["method"], r["epsilon"], r["n_target"]) == (method, eps, n)]
    return float(np.mean(vals))


def _plot(rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    eps = sorted({r["epsilon"] for r in rows})
    ns = sorted({r["n_target"] for r in rows})
    for method, style in (("noisy-fw", "-"), ("noisy-md", "--")):
        for n in ns:
            ys = [_mean(rows, "discrepancy", method, e, n) for e in eps]
            a.plot(eps, ys, style, marker="o", label=f"{method}, n = {n}")
    a.set_xscale("log")
    a.set_xlabel("ε")
    a.set_ylabel("‖M(q)‖₂")
    a.set_title("discrepancy of the private weights")
    a.legend(fontsize=8)
    n = max(ns)
    for method in METHODS:
        b.plot(eps, [_mean(rows, "mse", method, e, n) for e in eps], marker="o", label=method)
    b.set_xscale("log")
    b.set_xlabel("ε")
    b.set_ylabel("test MSE on the target")
    b.set_title(f"test error, n = {n} target rows")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run_classification(args: argparse.Namespace) -> int:
    """``--task benchmark``: the Office-Caltech pairs and the digits with the source public."""
    from dpda.data.loaders import require_data_dir
    from dpda.service.progress import Progress
    from tests.bench.harness import parse_pairs

    data_dir = str(require_data_dir(args.data_dir))
    pairs = parse_pairs(args.pairs)
    eps = [1.0, 8.0] if args.quick else args.epsilon
    jobs = [(s, t, e, seed) for s, t in pairs for e in eps for seed in range(args.seeds)]
    bar = Progress("classification runs")
    rows = []
    for i, (s, t, e, seed) in enumerate(jobs):
        rows.append(classification_pair(data_dir, s, t, e, seed))
        bar(i + 1, len(jobs))
    cols = ("source_only", "private_reweighting", "non_private_reweighting")
    print(f"\n{'pair':8s}{'ε':>6s}" + "".join(f"{c:>26s}" for c in cols))
    for s, t in pairs:
        for e in eps:
            rs = [r for r in rows if r["pair"] == f"{s}→{t}" and r["epsilon"] == e]
            cells = [f"{np.mean([r['accuracy'][c] for r in rs]):.2f}" for c in cols]
            print(f"{s}→{t:6s}{e:6g}" + "".join(f"{c:>26s}" for c in cells))
    write_json(args, {"task": "benchmark", "rows": rows})
    return 0


def run_bench_public_source(args: argparse.Namespace) -> int:
    from dpda.service.progress import Progress

    if args.task == "benchmark":
        return run_classification(args)
    ns = [1000, 4000] if args.quick else args.n_target
    eps = [0.5, 2.0, 8.0] if args.quick else args.epsilon
    reps = 1 if args.quick else args.repetitions
    steps = 300 if args.quick else args.steps
    jobs = [(n, e, r) for n in ns for e in eps for r in range(reps)]
    bar = Progress("public-source runs")
    rows: list[dict[str, Any]] = []
    t0 = time.perf_counter()
    for i, (n, e, r) in enumerate(jobs):
        rows += run_once(n, e, r, steps)
        bar(i + 1, len(jobs))
    print(f"\n{'n':>6s} {'ε':>6s} " + "".join(f"{m:>24s}" for m in METHODS))
    for n in ns:
        for e in eps:
            cells = []
            for m in METHODS:
                mse = _mean(rows, "mse", m, e, n)
                dis = "" if m == "oracle" else f" (‖M‖ {_mean(rows, 'discrepancy', m, e, n):.3f})"
                cells.append(f"{mse:.4f}{dis}")
            print(f"{n:6d} {e:6g} " + "".join(f"{c:>24s}" for c in cells))
    print(f"({time.perf_counter() - t0:.0f} s; MSE on fresh target rows; ‖M‖: discrepancy)")
    if args.png:
        _plot(rows, args.png)
        print(f"wrote {args.png}")
    write_json(args, {"steps": steps, "delta": 1.0 / 8000, "rows": rows})
    return 0


def register_public_source(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser(
        "public-source",
        help="the public-source experiment: private discrepancy minimisation from a public source",
    )
    s.add_argument(
        "--quick",
        action="store_true",
        help="one repetition, n_target 1000 and 4000, ε 0.5/2/8, 300 steps",
    )
    s.add_argument(
        "--n-target",
        type=int,
        nargs="+",
        default=[1000, 2000, 4000, 8000],
        help="paper: private target sizes (default 1000 2000 4000 8000)",
    )
    s.add_argument(
        "--epsilon",
        type=float,
        nargs="+",
        default=[0.5, 1.0, 2.0, 4.0, 8.0, 16.0],
        help="paper: the ε values (default 0.5 to 16)",
    )
    s.add_argument(
        "--repetitions", type=int, default=10, help="paper: runs per size and ε (default 10)"
    )
    s.add_argument("--steps", type=int, default=1000, help="K, optimisation steps")
    s.add_argument("--png", default=None, help="write the two plots to this PNG")
    s.add_argument(
        "--task",
        choices=["paper", "benchmark"],
        default="paper",
        help="paper: the seed's regression experiment; benchmark: classification on the "
        "benchmark features with the source public (--pairs, --data-dir, --seeds)",
    )
    add_pairs(s)
    add_data_dir(s)
    add_seeds(s, 3, "pair and ε")
    add_json_option(s)
    s.set_defaults(func=run_bench_public_source)
