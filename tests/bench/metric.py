"""``dpda bench metric``: the ground cost learned under DP (``dpda.dp.metric``).

(a) ``--toy`` (default on): the paper's toy (§VII-A). Two 2-D Gaussian classes of 100 points,
50 intra-class pairs per class and 50 inter-class pairs forming an acyclic graph, ε = 2,
margin 1, h = 0.5, batch 30, 10 epochs; non-private vs DP (Laplace, pair-level sensitivity
2h/|B| per batch, ε/10 per epoch: the batches of an epoch are disjoint) vs DP with the paper's
sensitivity reduction (per batch (max_p ‖g_p‖₁ + h)/|B|). The reduction's noise scale reads the
batch's own gradients, so it is *not* a DP guarantee as it stands (the scale is itself a
data-dependent output); it is reproduced here for the figure only and is not offered by the
service. This reproduction is pair-level (the paper's unit), unlike the service's record-level
release. ``--png`` draws the data mapped by each W and the objective against the steps.

(b) ``--accuracy``: DPDA with ``cost = metric`` vs today's cost, same session ε, on the 12
Office-Caltech pairs and M↔U; record unit (default policy, prototypes) and the attribute opt-in
(whole-batch rows); ``dpda simulate``'s defaults otherwise.

(c) ``--knn``: 5-NN accuracy on the source itself vs ε (the paper's Fig. 9): half of a domain's
rows train the metric (the service's mechanism, T full-batch Gaussian steps calibrated to ε with
the analytic Gaussian) and are the 5-NN reference set; the other half is tested, in W's space vs
in the projected space.
"""

from __future__ import annotations

import argparse
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from dpda.dp.ledger import default_delta
from dpda.service.output import add_json_option, write_json
from tests.bench.accuracy import dataset_of
from tests.bench.harness import (
    add_data_dir,
    add_jobs,
    add_pairs,
    add_seeds,
    gather,
    parse_pairs,
    worker_init,
)

# ------------------------------------------------------------------------------- (a) the toy
TOY = {"epsilon": 2.0, "margin": 1.0, "h": 0.5, "batch": 30, "epochs": 10, "learning_rate": 0.5}


def toy_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two Gaussian classes of 100 points in 2-D, on the scale of the paper's figure (points
    within a few tenths): apart along x, spread along y."""
    rng = np.random.default_rng(seed)
    cov = np.diag([0.03**2, 0.08**2])
    a = rng.multivariate_normal([0.15, 0.3], cov, 100)
    b = rng.multivariate_normal([0.27, 0.3], cov, 100)
    return np.vstack([a, b]), np.repeat([0, 1], 100)


def toy_pairs(y: np.ndarray, seed: int, intra: int = 50, inter: int = 50) -> np.ndarray:
    """``intra`` pairs inside each class and ``inter`` across, drawn at random and kept only if
    they close no cycle (union–find), so the graph is acyclic as in the paper."""
    rng = np.random.default_rng(seed)
    parent = list(range(y.size))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    out: list[tuple[int, int]] = []

    def add(pool_a: np.ndarray, pool_b: np.ndarray, k: int) -> None:
        got = 0
        while got < k:
            i, j = int(rng.choice(pool_a)), int(rng.choice(pool_b))
            ri, rj = root(i), root(j)
            if i == j or ri == rj:
                continue
            parent[ri] = rj
            out.append((i, j))
            got += 1

    c0, c1 = np.flatnonzero(y == 0), np.flatnonzero(y == 1)
    add(c0, c0, intra)
    add(c1, c1, intra)
    add(c0, c1, inter)
    return np.array(out, dtype=np.int64)


def _pair_grads(w: np.ndarray, x: np.ndarray, pairs: np.ndarray, sim: np.ndarray, margin: float):
    """Per-pair contrastive gradients ``(P, d′, ℓ)`` (small toy: formed explicitly)."""
    delta = x[pairs[:, 0]] - x[pairs[:, 1]]
    wd = delta @ w.T
    dist = np.linalg.norm(wd, axis=1)
    coef = np.where(sim, 2.0, 0.0)
    inside = (~sim) & (dist < margin)
    coef = np.where(inside, -2.0 * (margin - dist) / np.maximum(dist, 1e-12), coef)
    return coef[:, None, None] * wd[:, :, None] * delta[:, None, :]


def toy_run(
    x: np.ndarray, y: np.ndarray, pairs: np.ndarray, scheme: str, seed: int
) -> dict[str, Any]:
    """One run of ``nonpriv``, ``dpp`` or ``dpp-s``; W starts at the identity."""
    from dpda.dp.metric import contrastive_loss

    p = TOY
    rng = np.random.default_rng(seed)
    sim = y[pairs[:, 0]] == y[pairs[:, 1]]
    w = np.eye(2)
    eps_batch = p["epsilon"] / p["epochs"]  # disjoint batches per epoch: ε/epochs each
    h, b = p["h"], int(p["batch"])
    losses, sens = [], []
    for _ in range(int(p["epochs"])):
        order = rng.permutation(pairs.shape[0])
        for start in range(0, order.size, b):
            idx = order[start : start + b]
            g = _pair_grads(w, x, pairs[idx], sim[idx], p["margin"])
            l1 = np.abs(g).sum(axis=(1, 2))
            g = g * np.minimum(1.0, h / np.maximum(l1, 1e-300))[:, None, None]  # L1 clip to h
            mean = g.mean(axis=0)
            if scheme != "nonpriv":
                if scheme == "dpp":
                    delta1 = 2.0 * h / idx.size
                else:  # the paper's sensitivity reduction (data-dependent, see the docstring)
                    delta1 = (float(np.abs(g).sum(axis=(1, 2)).max()) + h) / idx.size
                sens.append(delta1)
                mean = mean + rng.laplace(0.0, delta1 / eps_batch, size=mean.shape)
            w = w - p["learning_rate"] * mean
            losses.append(contrastive_loss(w, x, pairs, sim, p["margin"]))
    return {"scheme": scheme, "w": w.tolist(), "loss": losses, "sensitivity": sens}


def _loo_1nn(z: np.ndarray, y: np.ndarray) -> float:
    d = ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1)
    np.fill_diagonal(d, np.inf)
    return float(np.mean(y[np.argmin(d, axis=1)] == y) * 100)


def run_toy(seed: int, png: str | None) -> dict[str, Any]:
    x, y = toy_data(seed)
    pairs = toy_pairs(y, seed)
    runs = [toy_run(x, y, pairs, s, seed + 1) for s in ("nonpriv", "dpp", "dpp-s")]
    out: dict[str, Any] = {"setting": TOY, "pairs": int(pairs.shape[0]), "runs": []}
    out["original_loo_1nn"] = _loo_1nn(x, y)
    print(f"toy: {pairs.shape[0]} pairs, leave-one-out 1-NN on the raw data {_loo_1nn(x, y):.1f}")
    for r in runs:
        z = x @ np.asarray(r["w"]).T
        r["loo_1nn"] = _loo_1nn(z, y)
        r["final_loss"] = r["loss"][-1]
        r["mean_sensitivity"] = float(np.mean(r["sensitivity"])) if r["sensitivity"] else 0.0
        out["runs"].append(r)
        print(
            f"  {r['scheme']:8s} final loss {r['final_loss']:.4f}  LOO 1-NN {r['loo_1nn']:.1f}"
            f"  mean batch sensitivity {r['mean_sensitivity']:.4f}"
        )
    if png:
        _plot_toy(x, y, pairs, runs, png)
        print(f"  figure: {png}")
    return out


def _plot_toy(x, y, pairs, runs, path: str) -> None:
    from tests.bench.figures import _pyplot

    plt = _pyplot()
    fig, axes = plt.subplots(1, 5, figsize=(22, 4.2))
    panels = [("original", np.eye(2))] + [(r["scheme"], np.asarray(r["w"])) for r in runs]
    for ax, (name, w) in zip(axes[:4], panels, strict=True):
        z = x @ w.T
        for a, b in pairs:
            ax.plot(z[[a, b], 0], z[[a, b], 1], color="0.85", lw=0.5, zorder=0)
        ax.scatter(z[y == 0, 0], z[y == 0, 1], s=9, label="class 0")
        ax.scatter(z[y == 1, 0], z[y == 1, 1], s=9, label="class 1")
        ax.set_title(f"{name}: LOO 1-NN {_loo_1nn(z, y):.0f}%")
        ax.set_aspect("equal", adjustable="datalim")
    axes[0].legend(fontsize=8)
    for r in runs:
        axes[4].plot(r["loss"], label=r["scheme"])
    axes[4].set_xlabel("step")
    axes[4].set_ylabel("contrastive loss (all pairs)")
    axes[4].set_title(f"objective, ε = {TOY['epsilon']:g}")
    axes[4].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------- (b) DPDA accuracy
def accuracy_one(
    data_dir: str, src: str, tgt: str, unit: str, cost: str, seed: int, epsilon: float,
    extra: dict[str, Any],
) -> dict[str, Any]:  # fmt: skip
    from dpda.data.loaders import load_domain
    from dpda.data.preprocessing import (
        DEFAULT_REPRESENTATION,
        DEFAULT_SCALING,
        default_attribute_bound,
    )
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import SessionTerms

    ds = dataset_of(src)
    s, t = load_domain(data_dir, ds, src), load_domain(data_dir, ds, tgt)
    data: dict[str, Any] = {
        "dataset": f"{ds}:{src}",
        "epsilon": epsilon,
        "delta": default_delta(s.x.shape[0]),
        "privacy_unit": unit,
        "cost": cost,
    }
    if cost == "metric":
        data.update(extra)
    terms = SessionTerms.model_validate(data)
    t0 = time.perf_counter()
    rep = DEFAULT_REPRESENTATION[ds]
    out = simulate(
        s,
        t,
        terms,
        rep,
        AdaptConfig(seed=seed),
        seed,
        baselines=False,
        scaling_mode=DEFAULT_SCALING[ds],
        attribute_bound=default_attribute_bound(rep, s.x.shape[1]),
    )
    return {
        "pair": f"{src}→{tgt}",
        "unit": unit,
        "cost": cost,
        "seed": seed,
        "accuracy": out.dpda.accuracy,
        "epsilon_spent": out.dpda.epsilon_spent,
        "seconds": time.perf_counter() - t0,
    }


def _accuracy_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    table: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        table.setdefault(r["pair"], {}).setdefault(f"{r['unit']}/{r['cost']}", []).append(
            r["accuracy"]
        )
    means = {p: {k: float(np.mean(v)) for k, v in c.items()} for p, c in table.items()}
    cols = list(dict.fromkeys(k for c in means.values() for k in c))
    print(f"{'pair':6s}" + "".join(f"{k:>22s}" for k in cols))
    for p, c in means.items():
        print(f"{p:6s}" + "".join(f"{c.get(k, float('nan')):22.2f}" for k in cols))
    summary: dict[str, Any] = {}
    for group, members in (("office_caltech", "CADW"), ("digits", "MU")):
        ps = [p for p in means if p[0] in members]
        if ps:
            summary[group] = {
                k: float(np.mean([means[p][k] for p in ps if k in means[p]])) for k in cols
            }
            print(f"{'mean ' + group[:6]:6s}" + "".join(f"{summary[group][k]:22.2f}" for k in cols))
    wins = {}
    for unit in ("record", "attribute"):
        a, b = f"{unit}/metric", f"{unit}/sqeuclidean"
        both = [p for p in means if a in means[p] and b in means[p]]
        if both:
            wins[unit] = {
                "pairs": len(both),
                "metric_better": sum(means[p][a] > means[p][b] for p in both),
                "mean_gain": float(np.mean([means[p][a] - means[p][b] for p in both])),
            }
            print(
                f"{unit}: metric better on {wins[unit]['metric_better']}/{len(both)} pairs, "
                f"mean gain {wins[unit]['mean_gain']:+.2f}"
            )
    return {"means": means, "summary": summary, "wins": wins}


# -------------------------------------------------------------------- (c) kNN on the source
def knn_one(
    data_dir: str, domain: str, epsilon: float | None, seed: int, ell: int, extra: dict[str, Any]
) -> dict[str, Any]:
    from sklearn.neighbors import KNeighborsClassifier

    from dpda.data.loaders import load_domain
    from dpda.data.preprocessing import DEFAULT_REPRESENTATION, DEFAULT_SCALING
    from dpda.dp.calibration import calibrate_sigma
    from dpda.dp.mechanisms import clip_rows
    from dpda.dp.metric import train_metric
    from dpda.target_party.view import target_pca_basis, target_view
    from dpda.terms import SessionTerms, metric_params

    ds = dataset_of(domain)
    d = load_domain(data_dir, ds, domain)
    view = target_view(d, DEFAULT_REPRESENTATION[ds], scaling_mode=DEFAULT_SCALING[ds])
    rng = np.random.default_rng(seed)
    order = rng.permutation(d.x.shape[0])
    tr, te = order[: order.size // 2], order[order.size // 2 :]
    y = np.asarray(d.y)
    basis = target_pca_basis(view.x[tr], ell)
    z = view.x @ basis
    c = float(np.quantile(np.linalg.norm(z[tr], axis=1), 0.9))
    z = clip_rows(z, c)
    terms = SessionTerms.model_validate(
        {"dataset": "knn", "epsilon": 1.0, "delta": 1e-5, "projection_dim": ell, "cost": "metric",
         **extra}
    )  # fmt: skip
    p = metric_params(terms)
    n = tr.size
    if epsilon is None:
        sigma = 0.0
    else:  # T steps of σ√T: one Gaussian of σ calibrated to (ε, δ = 1/(10n))
        sigma = calibrate_sigma(epsilon, default_delta(n), "analytic") * float(np.sqrt(p.steps))
    w = train_metric(z[tr], y[tr], p, c, sigma, np.random.default_rng([seed, 3]))

    def knn(a: np.ndarray) -> float:
        model = KNeighborsClassifier(5).fit(a[tr], y[tr])
        return float(np.mean(model.predict(a[te]) == y[te]) * 100)

    return {
        "domain": domain,
        "epsilon": epsilon,
        "seed": seed,
        "knn_metric": knn(z @ w.T),
        "knn_projected": knn(z),
    }


def run_bench_metric(args: argparse.Namespace) -> int:
    import json

    from dpda.data.loaders import default_data_dir

    extra = json.loads(args.metric_terms) if args.metric_terms else {}
    result: dict[str, Any] = {"metric_terms": extra}
    if args.toy:
        result["toy"] = run_toy(args.seed, args.png)
    data_dir = args.data_dir or str(default_data_dir())
    jobs = args.jobs or 1
    if args.accuracy:
        pairs = parse_pairs(args.pairs)
        with ProcessPoolExecutor(jobs, initializer=worker_init) as pool:
            tasks = [
                pool.submit(accuracy_one, data_dir, s, t, u, c, seed, args.epsilon, extra)
                for s, t in pairs
                for u in args.units
                for c in ("sqeuclidean", "metric")
                for seed in range(args.seeds)
            ]
            rows = gather(tasks, "sessions")
        result["accuracy"] = {"epsilon": args.epsilon, "seeds": args.seeds, "rows": rows}
        result["accuracy"].update(_accuracy_table(rows))
    if args.knn:
        eps_list: list[float | None] = [*args.knn_epsilon, None]
        with ProcessPoolExecutor(jobs, initializer=worker_init) as pool:
            tasks = [
                pool.submit(knn_one, data_dir, dom, e, seed, args.knn_dim, extra)
                for dom in args.knn_domains
                for e in eps_list
                for seed in range(args.seeds)
            ]
            rows = gather(tasks, "kNN runs")
        print(f"{'domain':6s} {'ε':>6s} {'5-NN in W':>10s} {'5-NN projected':>15s}")
        knn_means = []
        for dom in args.knn_domains:
            for e in eps_list:
                sel = [r for r in rows if r["domain"] == dom and r["epsilon"] == e]
                m = float(np.mean([r["knn_metric"] for r in sel]))
                b = float(np.mean([r["knn_projected"] for r in sel]))
                knn_means.append({"domain": dom, "epsilon": e, "knn_metric": m, "knn_projected": b})
                print(f"{dom:6s} {('∞' if e is None else f'{e:g}'):>6s} {m:10.2f} {b:15.2f}")
        result["knn"] = {"rows": rows, "means": knn_means, "dim": args.knn_dim}
    write_json(args, result)
    return 0


def register_metric(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser(
        "metric",
        help="the DP-learned ground cost: the paper's toy, DPDA accuracy with the "
        "metric vs the default cost, 5-NN on the source vs ε",
    )
    s.add_argument(
        "--toy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="(a) the paper's toy problem (default on; --no-toy skips it)",
    )
    s.add_argument("--png", default=None, help="(a) the toy's figure")
    s.add_argument("--seed", type=int, default=0, help="(a) the toy's seed")
    s.add_argument("--accuracy", action="store_true", help="(b) DPDA, metric vs sqeuclidean")
    add_pairs(s)
    s.add_argument(
        "--units",
        nargs="+",
        choices=["record", "attribute"],
        default=["record"],
        help="(b) privacy units to run (default record)",
    )
    s.add_argument("--epsilon", type=float, default=8.0, help="(b) the session's total ε")
    s.add_argument("--knn", action="store_true", help="(c) 5-NN on the source vs ε")
    s.add_argument(
        "--knn-domains",
        nargs="+",
        default=["A", "M"],
        help="(c) domains whose 5-NN accuracy is measured (default A M)",
    )
    s.add_argument(
        "--knn-epsilon",
        type=float,
        nargs="+",
        default=[0.5, 1.0, 2.0, 4.0, 8.0],
        help="(c) the ε values of the 5-NN curve",
    )
    s.add_argument("--knn-dim", type=int, default=20, help="(c) the projected dimension ℓ")
    s.add_argument(
        "--metric-terms", default=None, help="JSON of metric terms, e.g. '{\"metric_dim\": 10}'"
    )
    add_seeds(s, 1, "pair and ε")
    add_data_dir(s)
    add_jobs(s, 1)
    add_json_option(s)
    s.set_defaults(func=run_bench_metric)
