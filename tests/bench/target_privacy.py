"""``dpda bench target-privacy``: what the target's own DP costs in accuracy.

Per pair (the 12 Office-Caltech pairs and M↔U), seed and target budget: one DPDA session at the
source's ε (default 8, the default policy: record unit, noisy class prototypes, one
whole-dataset release, δ = 1/(10·ns)), with the target's column scaling, its target-pca basis
and the record unit's clipping norm either exact (``exact``, today's disclosure) or released
under the target's own DP at ``ε_t`` (``dpda.dp.target_disclosure``, δ_t = 1/(10·nt)). Also
the target-PCA basis replaced by a JL matrix (no basis to disclose; the scaling alone under DP).
Pairs run in worker processes, one BLAS thread each.
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


def one(
    data_dir: str, src: str, tgt: str, seed: int, target_epsilon: float | None, projection: str,
    epsilon: float, row_queries: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One session (``row_queries`` None) or, with PATE, DPDA+PATE and PATE alone under the
    target's ``row_queries`` (exact | synthetic | dp at ε_q = 4)."""
    from dpda.data.loaders import load_domain
    from dpda.data.preprocessing import DEFAULT_REPRESENTATION, DEFAULT_SCALING
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import SessionTerms

    ds = dataset_of(src)
    s, t = load_domain(data_dir, ds, src), load_domain(data_dir, ds, tgt)
    terms = SessionTerms(
        dataset=f"{ds}:{src}",
        epsilon=epsilon,
        delta=default_delta(s.x.shape[0]),
        projection=projection,  # type: ignore[arg-type]
    )
    t0 = time.perf_counter()
    pate = row_queries is not None
    out = simulate(
        s,
        t,
        terms,
        DEFAULT_REPRESENTATION[ds],
        AdaptConfig(seed=seed),
        seed,
        baselines=False,
        scaling_mode=DEFAULT_SCALING[ds],
        target_epsilon=target_epsilon,
        methods=("dpda+pate", "pate") if pate else ("dpda",),
        target_row_queries=row_queries or "exact",
    )
    if pate:
        return {
            "pair": f"{src}→{tgt}",
            "seed": seed,
            "target_epsilon": target_epsilon,
            "row_queries": row_queries,
            "accuracy_dpda_pate": out.runs["dpda+pate"].accuracy,
            "accuracy_pate": out.runs["pate"].accuracy,
            "epsilon_spent": max(r.epsilon_spent for r in out.runs.values()),
            "target_epsilon_spent": out.target_epsilon_spent,
            "seconds": time.perf_counter() - t0,
        }
    return {
        "pair": f"{src}→{tgt}",
        "seed": seed,
        "target_epsilon": target_epsilon,
        "projection": projection,
        "accuracy": out.dpda.accuracy,
        "epsilon_spent": out.dpda.epsilon_spent,
        "target_epsilon_spent": out.target_epsilon_spent,
        "seconds": time.perf_counter() - t0,
    }


def _label(r: dict[str, Any]) -> str:
    t = "exact" if r["target_epsilon"] is None else f"ε_t={r['target_epsilon']:g}"
    if "row_queries" in r:
        return f"{t}, q={r['row_queries']}"
    return t if r["projection"] == "target-pca" else f"{t}, jl"


def _table(rows: list[dict[str, Any]], key: str) -> tuple[dict[str, dict[str, float]], dict]:
    labels = list(dict.fromkeys(_label(r) for r in rows))
    table: dict[str, dict[str, list[float]]] = {}
    for r in rows:
        table.setdefault(r["pair"], {}).setdefault(_label(r), []).append(r[key])
    means = {p: {k: float(np.mean(v)) for k, v in cols.items()} for p, cols in table.items()}
    print(f"{key}:")
    print(f"{'pair':6s}" + "".join(f"{k:>20s}" for k in labels))
    for p, cols in means.items():
        print(f"{p:6s}" + "".join(f"{cols.get(k, float('nan')):20.2f}" for k in labels))
    office = [p for p in means if p[0] in "CADW"]
    summary = {k: float(np.mean([means[p][k] for p in office])) for k in labels if office}
    print(f"{'mean OC':6s}" + "".join(f"{summary.get(k, float('nan')):20.2f}" for k in labels))
    return means, summary


def run_bench_target_privacy(args: argparse.Namespace) -> int:
    from dpda.data.loaders import default_data_dir

    data_dir = args.data_dir or str(default_data_dir())
    pairs = parse_pairs(args.pairs)
    arms: list[tuple[float | None, str]] = [(None, "target-pca")]
    arms += [(e, "target-pca") for e in args.target_epsilon]
    if args.jl:
        arms += [(e, "jl") for e in args.target_epsilon]
    jobs = args.jobs or None
    # PATE under each target option: today's (exact disclosures, exact rows), then the target's
    # DP disclosures at the first ε_t with each row-query form
    e_t = args.target_epsilon[0]
    pate_arms = [(None, "exact"), (e_t, "exact"), (e_t, "synthetic"), (e_t, "dp")]
    with ProcessPoolExecutor(jobs, initializer=worker_init) as pool:
        tasks = [
            pool.submit(one, data_dir, s, t, seed, e, proj, args.epsilon)
            for s, t in pairs
            for seed in range(args.seeds)
            for e, proj in arms
        ]
        tasks += [
            pool.submit(one, data_dir, s, t, seed, e, "target-pca", args.epsilon, q)
            for s, t in pairs
            for seed in range(args.seeds)
            for e, q in (pate_arms if args.pate else [])
        ]
        rows = gather(tasks, "sessions")
    plain = [r for r in rows if "row_queries" not in r]
    means, summary = _table(plain, "accuracy")
    out: dict[str, Any] = {
        "epsilon": args.epsilon,
        "seeds": args.seeds,
        "rows": rows,
        "means": means,
        "office_caltech_mean": summary,
    }
    if args.pate:
        queried = [r for r in rows if "row_queries" in r]
        for key in ("accuracy_dpda_pate", "accuracy_pate"):
            m, sm = _table(queried, key)
            out[f"pate_{key}"] = {"means": m, "office_caltech_mean": sm}
    write_json(args, out)
    return 0


def register_target_privacy(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser(
        "target-privacy",
        help="DPDA accuracy with the target's scaling and basis exact vs under its own DP",
    )
    add_data_dir(s)
    add_pairs(s)
    s.add_argument(
        "--target-epsilon",
        type=float,
        nargs="+",
        default=[1.0, 4.0],
        help="the target's own ε values for its scaling and basis (default 1 4)",
    )
    s.add_argument("--epsilon", type=float, default=8.0, help="the source's session ε")
    add_seeds(s, 3, "pair and setting")
    s.add_argument("--jl", action="store_true", help="also: a JL projection (no basis sent)")
    s.add_argument(
        "--pate",
        action="store_true",
        help="also: DPDA+PATE and PATE alone under each target row-query option (exact rows "
        "with exact disclosures; with DP disclosures at the first --target-epsilon: exact, "
        "synthetic, dp at ε_q = 4)",
    )
    add_jobs(s)
    add_json_option(s)
    s.set_defaults(func=run_bench_target_privacy)
