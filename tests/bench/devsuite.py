"""``dpda bench accuracy --protocol devsuite``: the job's defaults on the development suite
(``dpda.data.devsuite``), each pair beside its baselines, and how well each label-free
criterion of ``choice.CRITERIA`` picks among the job's arms against an oracle that sees the
target's labels.

Per pair, seed and ε: DPDA (the adapted model), the model the job keeps, DP without
adaptation, non-private source-only (1-NN and logistic) and non-private OTDA (their better
scaling by the target's labels: a reference, not a method), ε spent. Per criterion: how often
the arm it picks is the best arm (within ``BEST_WITHIN`` points), and the mean accuracy it
loses against the oracle's pick.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

BEST_WITHIN = 0.5  # points: an arm this close to the best counts as the best
ARMS = ("dpda", "kept", "dp_no_adaptation", "source_only", "source_only_logistic", "otda")


def devsuite_pair(name: str, seed: int, epsilon: float, cells: int | None = None) -> dict[str, Any]:
    """One development pair at ``seed`` and ``epsilon`` with the job's defaults (``dpda
    simulate`` with no flag on the pair's two tables; ``cells``: ``--cells``)."""
    from dpda.data.devsuite import REPRESENTATION, pair
    from dpda.dp.ledger import default_delta
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import SessionTerms

    s, t = pair(name, seed)
    given: dict[str, Any] = {} if cells is None else {"cells": cells}
    terms = SessionTerms.model_validate(
        {"dataset": f"devsuite:{name}", "epsilon": epsilon,
         "delta": default_delta(s.x.shape[0]), **given}
    )  # fmt: skip
    t0 = time.perf_counter()
    out = simulate(s, t, terms, REPRESENTATION[name], AdaptConfig(seed=seed), seed,
                   scaling_mode="auto")  # fmt: skip
    data = out.to_json(terms)
    acc = data["accuracy"]
    return {
        "pair": name,
        "seed": seed,
        "epsilon": epsilon,
        **{a: acc.get(a) for a in ARMS},
        "epsilon_spent": data["epsilon_spent"],
        "cells": data.get("cells"),
        "preprocessing": preprocessing_of(data, epsilon),
        "choice": data["choice"],
        "seconds": time.perf_counter() - t0,
    }


def pick(arms: list[dict[str, Any]], criterion: str, gate: float | None = None) -> dict:
    """The arm the job's rule (``choice.pick``) keeps among ``arms`` by ``criterion``,
    replayed on the recorded scores (``gate`` 1: no count gate)."""
    from dpda.target_party.choice import pick as rule

    return arms[rule(arms, criterion, gate)[0]]


def preprocessing_of(data: dict[str, Any], epsilon: float) -> dict[str, Any]:
    """What a run's source estimated under DP before its release: mode, its share of the ε
    granted and that ε, the row bound C and the rows it clipped (the source's estimate)."""
    pre = data.get("preprocessing") or {}
    share = float(pre.get("share") or 0.0) if pre.get("mode", "none") != "none" else 0.0
    return {
        "mode": pre.get("mode", "none"),
        "share": share,
        "epsilon": share * epsilon,
        "clip_norm": pre.get("clip_norm"),
        "rows_clipped_estimate": pre.get("rows_clipped_estimate"),
    }


def criteria_table(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per criterion: the share of runs whose pick is the best arm, and the mean and worst
    accuracy lost against the oracle's pick; the same for two fixed rules (the job's own
    DPDA arm, the release without adaptation) for scale, and for what the job kept (its vote is
    no single arm, so it may lose less than nothing)."""
    from dpda.target_party.choice import CRITERIA, CRITERION

    out: dict[str, Any] = {}
    runs = [r for r in rows if r["choice"] and r["choice"]["arms"]]
    names = list(dict.fromkeys([CRITERION, "entropy+consistency", *CRITERIA]))
    rules: dict[str, Any] = {c: (lambda arms, c=c: pick(arms, c)) for c in names}
    rules.update({f"{c} (no gate)": (lambda arms, c=c: pick(arms, c, 1.0)) for c in names})
    rules["always-dpda"] = lambda arms: arms[0]
    rules["always-no-adaptation"] = lambda arms: next(a for a in arms if not a["adapt"])
    for name, rule in rules.items():
        lost, best = [], 0
        for r in runs:
            arms = [dict(a) for a in r["choice"]["arms"]]
            oracle = max(a["accuracy"] for a in arms)
            got = rule(arms)["accuracy"]
            lost.append(oracle - got)
            best += oracle - got <= BEST_WITHIN
        out[name] = {
            "picks_best": f"{best}/{len(runs)}",
            "picks_best_share": best / max(len(runs), 1),
            "mean_loss": float(np.mean(lost)) if lost else None,
            "worst_loss": float(np.max(lost)) if lost else None,
        }
    kept = [r for r in runs if r["choice"].get("kept_accuracy") is not None]
    lost = [max(a["accuracy"] for a in r["choice"]["arms"]) - r["choice"]["kept_accuracy"]
            for r in kept]  # fmt: skip
    out["the job's rule (measured)"] = {  # the vote is no arm: its accuracy as the job kept it
        "picks_best": f"{sum(x <= BEST_WITHIN for x in lost)}/{len(kept)}",
        "picks_best_share": sum(x <= BEST_WITHIN for x in lost) / max(len(kept), 1),
        "mean_loss": float(np.mean(lost)) if lost else None,
        "worst_loss": float(np.max(lost)) if lost else None,
    }
    return out


def summarize_devsuite(rows: list[dict[str, Any]], epsilons: list[float]) -> dict[str, Any]:
    from tests.bench.accuracy import mean_of

    out: dict[str, Any] = {}
    for eps in epsilons:
        at = [r for r in rows if r["epsilon"] == eps]
        pairs = sorted({r["pair"] for r in at}, key=[r["pair"] for r in at].index)
        table: dict[str, dict[str, Any]] = {}
        for p in pairs:
            runs = [r for r in at if r["pair"] == p]
            table[p] = {a: mean_of([r[a] for r in runs]) for a in ARMS}
            table[p]["epsilon_spent"] = mean_of([r["epsilon_spent"] for r in runs])
            table[p]["preprocessing_share"] = mean_of(
                [(r.get("preprocessing") or {}).get("share") for r in runs]
            )
            table[p]["kept_arms"] = sorted({r["choice"]["kept"] for r in runs if r["choice"]})
            table[p]["seeds"] = len(runs)
        kept_ok = sum(
            (table[p]["kept"] or 0) >= (table[p]["dp_no_adaptation"] or 0) - 1.0 for p in pairs
        )
        out[f"{eps:g}"] = {
            "pairs": table,
            "mean": {a: mean_of([table[p][a] for p in pairs]) for a in ARMS},
            "kept_at_least_dp_no_adaptation_minus_1": f"{kept_ok}/{len(pairs)}",
            "criteria": criteria_table(at),
        }
    return out


def print_devsuite(summary: dict[str, Any]) -> None:
    from tests.bench.harness import cell

    for eps, block in summary.items():
        print(f"\nDevelopment suite at ε = {eps} (mean over seeds)")
        print(f"{'pair':<16} {'DPDA':>6} {'kept':>6} {'DP no ad':>8} {'1-NN':>6} {'logistic':>8} "
              f"{'OTDA':>6} {'ε spent':>8} {'pre. share':>10}  kept arm(s)")  # fmt: skip
        rows = [*block["pairs"].items(), ("mean", block["mean"])]
        for p, r in rows:
            print(
                f"{p:<16} {cell(r['dpda']):>6} {cell(r['kept']):>6} "
                f"{cell(r['dp_no_adaptation']):>8} "
                f"{cell(r['source_only']):>6} {cell(r['source_only_logistic']):>8} "
                f"{cell(r['otda']):>6} {cell(r.get('epsilon_spent')):>8} "
                f"{cell(r.get('preprocessing_share'), 2):>10}  " + ", ".join(r.get("kept_arms", []))
            )
        print(
            "kept ≥ DP without adaptation − 1 on "
            f"{block['kept_at_least_dp_no_adaptation_minus_1']} pairs"
        )
        print(f"{'criterion':<22} {'picks best':>10} {'mean loss':>9} {'worst':>6}")
        for c, v in block["criteria"].items():
            print(
                f"{c:<22} {v['picks_best']:>10} {cell(v['mean_loss']):>9} "
                f"{cell(v['worst_loss']):>6}"
            )


def run_devsuite(pool: Any, args: Any) -> dict[str, Any]:
    """Every pair of the suite (or ``--pairs``) at every ``--epsilons`` and ``--seeds``."""
    from dpda.data.devsuite import PAIRS
    from tests.bench.harness import gather

    names = args.pairs or list(PAIRS)
    rows = gather(
        [
            pool.submit(devsuite_pair, name, seed, eps, args.cells)
            for eps in args.epsilons
            for name in names
            for seed in range(args.seeds)
        ],
        "devsuite runs",
    )
    summary = summarize_devsuite(rows, args.epsilons)
    print_devsuite(summary)
    return {"runs": rows, "table": summary}
