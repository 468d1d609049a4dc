"""``dpda bench dpot-error`` (the DPOT paper's Figure 2) and ``dpda bench privacy-utility``.

dpot-error: Algorithm 1 on one domain pair. The source projects its rows with a JL matrix ``M``
(``ℓ`` columns, ``w`` = its largest row norm, the attribute-unit sensitivity of a row) and adds
``N(0, (σ/w · w)²)`` noise; the target computes the debiased cost ``‖Z_i − (Xt·M)_j‖² − ℓσ²``.
``W̃`` is the exact (EMD) transport value on that cost, ``W`` the exact value on the squared
Euclidean cost between the preprocessed features (what DPOT estimates), and ``Err = |W̃ − W|/W``,
averaged over runs — the paper's measure, which includes the JL distortion. ``Err_noise`` compares
``W̃`` with ``W_M``, the value between the *clean* projected rows, so it isolates what the privacy
noise adds. Whole batch: every row; minibatch: ``B`` Poisson-sampled source rows against ``B``
random target rows, averaged over many batches. Also reported: how much of the private plan's
mass sits where the clean projected plan's does (``1 − ½‖γ̃ − γ_M‖₁``).

privacy-utility: accuracy against ε for DPDA, PATE and DPDA+PATE (each its own session at the
same ε), with the non-private OTDA and source-only lines, averaged over pairs and seeds; PNG.
"""

from __future__ import annotations

import argparse
import os
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np

from dpda.dp.ledger import default_delta
from dpda.dp.mechanisms import PrivacyUnit
from dpda.errors import ConfigError
from dpda.service.output import add_json_option, write_json
from tests.bench.harness import add_data_dir, add_jobs, add_pairs, add_seeds, worker_init


def _load_pair(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, str]:
    """Preprocessed source and target features (target scaling applied to both)."""
    from dpda.data.preprocessing import DEFAULT_REPRESENTATION, DEFAULT_SCALING
    from dpda.simulation import source_in_target_scaling
    from dpda.target_party.view import target_view

    if args.dataset == "synthetic":
        from dpda.data.synthetic import two_domains

        s, t = two_domains(1000, 1000, seed=0)
        label = "synthetic"
    else:
        from dpda.data.loaders import load_domain, require_data_dir

        data_dir = require_data_dir(args.data_dir)
        s = load_domain(data_dir, args.dataset, args.source)
        t = load_domain(data_dir, args.dataset, args.target)
        label = f"{args.dataset} {args.source}→{args.target}"
    rep = DEFAULT_REPRESENTATION[args.dataset]
    view = target_view(t, rep, scaling_mode=DEFAULT_SCALING[args.dataset])
    return source_in_target_scaling(s, view, rep), view.x, label


def _emd(a_rows: int, b_rows: int, cost: np.ndarray) -> tuple[np.ndarray, float]:
    import ot

    from dpda.ot.solvers import uniform

    plan = ot.emd(uniform(a_rows), uniform(b_rows), cost, numItermax=10_000_000)
    return plan, float(np.sum(plan * cost))


def dpot_errors(
    xs: np.ndarray,
    xt: np.ndarray,
    ratios: list[float],
    ell: int,
    runs: int,
    rng: np.random.Generator,
    batch: int = 0,
) -> list[dict[str, float]]:
    """Mean Err and plan agreement per σ/w; ``batch = 0``: whole batch."""
    from dpda.dp.mechanisms import gaussian_noise, jl_matrix, projection_sensitivity
    from dpda.ot.costs import sq_euclidean

    out = []
    for ratio in ratios:
        errs, errs_noise, agree = [], [], []
        for _ in range(runs):
            if batch:
                s_rows = np.flatnonzero(rng.random(xs.shape[0]) < batch / xs.shape[0])
                t_rows = rng.choice(xt.shape[0], min(batch, xt.shape[0]), replace=False)
                if s_rows.size == 0:
                    continue
                s, t = xs[s_rows], xt[t_rows]
            else:
                s, t = xs, xt
            _, w = _emd(s.shape[0], t.shape[0], sq_euclidean(s, t))
            m = jl_matrix(xs.shape[1], ell, rng)
            tm = t @ m
            plan_m, w_m = _emd(s.shape[0], t.shape[0], sq_euclidean(s @ m, tm))
            std = ratio * projection_sensitivity(m, "attribute", "add-remove")
            z = s @ m + gaussian_noise((s.shape[0], ell), std, rng)
            debiased = sq_euclidean(z, tm) - ell * std**2
            plan_t, w_t = _emd(s.shape[0], t.shape[0], debiased)
            errs.append(abs(w_t - w) / w)
            errs_noise.append(abs(w_t - w_m) / w_m)
            agree.append(1.0 - 0.5 * float(np.abs(plan_t - plan_m).sum()))
        out.append(
            {
                "sigma_over_w": ratio,
                "err": float(np.mean(errs)),
                "err_std": float(np.std(errs)),
                "err_noise": float(np.mean(errs_noise)),
                "plan_agreement": float(np.mean(agree)),
                "runs": len(errs),
            }
        )
    return out


def _pyplot() -> Any:
    """matplotlib's pyplot on the file-only backend; it is the ``bench`` extra (daemon hosts do
    not need it: the job report draws its own SVG)."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--png needs matplotlib: pip install 'dpda[bench]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plot_dpot(result: dict[str, Any], path: str) -> None:
    plt = _pyplot()

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, key, title in (
        (axes[0], "whole_batch", "whole batch"),
        (axes[1], "minibatch", f"minibatches of {result['batch_size']}"),
    ):
        rows = result[key]
        x = [r["sigma_over_w"] for r in rows]
        ax.errorbar(
            x,
            [r["err"] for r in rows],
            yerr=[r["err_std"] for r in rows],
            marker="o",
            capsize=3,
            label="Err = |W̃ − W| / W (paper; includes JL distortion)",
        )
        ax.plot(x, [r["err_noise"] for r in rows], marker="^", label="|W̃ − W_M| / W_M (noise only)")
        ax.plot(
            x,
            [1 - r["plan_agreement"] for r in rows],
            marker="s",
            linestyle="--",
            label="plan mass moved vs the clean projected plan",
        )
        ax.set_xlabel("noise ratio σ/w")
        ax.set_title(f"{title} ({rows[0]['runs']} runs)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("relative error / fraction of mass")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.suptitle(f"DPOT error, {result['data']}, JL ℓ = {result['projection_dim']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_dpot_error(args: argparse.Namespace) -> int:
    xs, xt, label = _load_pair(args)
    rng = np.random.default_rng(args.seed)
    ratios = args.ratios
    result: dict[str, Any] = {
        "data": label,
        "projection_dim": args.projection_dim,
        "batch_size": args.batch_size,
    }
    for key, batch, runs in (
        ("whole_batch", 0, args.runs),
        ("minibatch", args.batch_size, args.batch_runs),
    ):
        rows = dpot_errors(xs, xt, ratios, args.projection_dim, runs, rng, batch)
        result[key] = rows
        print(f"{key} ({label}, JL ℓ={args.projection_dim}, {runs} runs per point)")
        print(f"  {'σ/w':>6s} {'Err':>16s} {'Err_noise':>10s} {'plan agreement':>15s}")
        for r in rows:
            print(
                f"  {r['sigma_over_w']:6.2f} {r['err']:7.4f} ± {r['err_std']:.4f} "
                f"{r['err_noise']:10.4f} {r['plan_agreement']:15.4f}"
            )
    write_json(args, result)
    if args.png:
        _plot_dpot(result, args.png)
        print(f"wrote {args.png}")
    return 0


# ------------------------------------------------------------------------------ privacy-utility
def _pu_task(data_dir: str, src: str, tgt: str, eps: float, seed: int, batch: int) -> dict:
    from dpda.terms import SessionTerms
    from tests.bench.accuracy import run_methods

    def terms_for(dataset: str, ns: int) -> SessionTerms:
        return SessionTerms(
            dataset=dataset,
            epsilon=eps,
            delta=default_delta(ns),
            batch_size=batch,
            privacy_unit=PrivacyUnit.ATTRIBUTE,
        )

    _, data = run_methods(data_dir, src, tgt, seed, terms_for)
    return {
        "pair": f"{src}→{tgt}",
        "epsilon": eps,
        "seed": seed,
        **data["accuracy"],
        "epsilon_spent": data["epsilon_by_method"],
    }


def _plot_pu(table: list[dict[str, Any]], pairs: list[str], path: str) -> None:
    plt = _pyplot()

    eps = [r["epsilon"] for r in table]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key, name, style in (
        ("dpda", "DPDA", "o-"),
        ("pate", "PATE", "s-"),
        ("dpda_pate", "DPDA+PATE", "^-"),
    ):
        ax.plot(eps, [r[key] for r in table], style, label=name)
    ax.axhline(
        np.mean([r["otda"] for r in table]), color="k", linestyle="--", label="OTDA (non-private)"
    )
    ax.axhline(
        np.mean([r["source_only"] for r in table]), color="grey", linestyle=":", label="source only"
    )
    ax.set_xscale("log")
    ax.set_xticks(eps)
    ax.set_xticklabels([f"{e:g}" for e in eps])
    ax.set_xlabel("ε (δ = 1/(10·ns); attribute unit, whole batch)")
    ax.set_ylabel("target accuracy, % (1-NN)")
    ax.set_title(f"privacy–utility, mean over {', '.join(pairs)}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_privacy_utility(args: argparse.Namespace) -> int:
    from dpda.data.loaders import require_data_dir
    from tests.bench.harness import gather, parse_pairs

    data_dir = require_data_dir(args.data_dir)
    pairs = parse_pairs(args.pairs)
    names = [f"{s}→{t}" for s, t in pairs]
    with ProcessPoolExecutor(args.jobs or os.cpu_count() or 1, initializer=worker_init) as pool:
        tasks = [
            pool.submit(_pu_task, str(data_dir), s, t, e, seed, args.batch_size)
            for e in args.epsilons
            for s, t in pairs
            for seed in range(args.seeds)
        ]
        rows = gather(tasks, "privacy-utility runs")
    cols = ("source_only", "otda", "dpda", "pate", "dpda_pate")
    table = [
        {
            "epsilon": e,
            **{c: float(np.mean([r[c] for r in rows if r["epsilon"] == e])) for c in cols},
        }
        for e in args.epsilons
    ]
    print(f"accuracy (%) against ε, mean over {', '.join(names)} × {args.seeds} seeds")
    print(f"{'ε':>6s}" + "".join(f"{c:>13s}" for c in cols))
    for r in table:
        print(f"{r['epsilon']:6g}" + "".join(f"{r[c]:13.2f}" for c in cols))
    write_json(args, {"pairs": names, "table": table, "runs": rows})
    if args.png:
        _plot_pu(table, names, args.png)
        print(f"wrote {args.png}")
    return 0


def register_figures(bsub: argparse._SubParsersAction) -> None:
    d = bsub.add_parser("dpot-error", help="DPOT's |W̃ − W|/W against σ/w (paper Figure 2)")
    add_data_dir(d)
    d.add_argument(
        "--dataset",
        choices=["office-caltech", "mnist-usps", "synthetic"],
        default="office-caltech",
        help="the benchmark (default office-caltech)",
    )
    d.add_argument("--source", default="C", help="the source domain (default C)")
    d.add_argument("--target", default="A", help="the target domain (default A)")
    d.add_argument("--projection-dim", type=int, default=80, help="JL ℓ (default 80 = k/10)")
    d.add_argument(
        "--ratios",
        type=float,
        nargs="+",
        default=[0.0, 0.2, 0.4, 0.6, 0.7, 0.8, 1.0, 1.2, 1.3, 1.5],
        help="the σ/w values (default 0 to 1.5)",
    )
    d.add_argument("--runs", type=int, default=10, help="whole-batch runs per σ/w")
    d.add_argument(
        "--batch-size",
        type=int,
        default=128,
        help="Poisson batch size of the minibatch runs (default 128)",
    )
    d.add_argument("--batch-runs", type=int, default=200, help="minibatches per σ/w")
    d.add_argument("--seed", type=int, default=0, help="fixes the noise (default 0)")
    add_json_option(d)
    d.add_argument("--png", default=None, metavar="OUT", help="also draw the figure to this PNG")
    d.set_defaults(func=run_dpot_error)

    p = bsub.add_parser("privacy-utility", help="accuracy against ε for DPDA, PATE, DPDA+PATE")
    add_data_dir(p)
    add_pairs(p, ["C:A", "A:W", "W:D", "M:U"])
    p.add_argument(
        "--epsilons",
        type=float,
        nargs="+",
        default=[0.5, 1, 2, 4, 8, 20],
        help="the ε values of the curve (default 0.5 to 20)",
    )
    add_seeds(p, 2, "pair and ε")
    p.add_argument("--batch-size", type=int, default=0, help="0: whole batch (default)")
    add_jobs(p)
    add_json_option(p)
    p.add_argument("--png", default=None, metavar="OUT", help="also draw the figure to this PNG")
    p.set_defaults(func=run_privacy_utility)
