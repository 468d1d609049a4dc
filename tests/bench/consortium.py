"""``dpda bench accuracy --protocol consortium``: several private sources for one target on
Office-Caltech, leave one domain out (the three other domains as sources of the fourth);
``--protocol consortium-devsuite``: the same job on the development suite's several-source
families (``dpda.data.devsuite.SEVERAL``), data other than Office-Caltech's.

Each cell is what ``dpda simulate --dataset office-caltech --source X --source Y --source Z
--target T --seed N --json OUT`` prints and writes (the contract's command, run in process),
beside each of the three one-source jobs with the job's defaults on the same seed (their kept
models: "best single-source job"), the pooled releases without adaptation and the pooled
non-private references (source-only 1-NN and logistic, OTDA).
"""

from __future__ import annotations

import contextlib
import io
import json
import tempfile
from pathlib import Path
from typing import Any

from tests.bench.accuracy import mean_of
from tests.bench.harness import cell, gather

DOMAINS = "ACDW"
COLUMNS = ("dpda", "kept", "dp_no_adaptation", "source_only", "source_only_logistic", "otda")


def _simulated(args: list[str], out: Path) -> dict[str, Any]:
    """What ``dpda ARGS`` (a ``simulate`` writing its JSON to ``out``) wrote, run in process."""
    from dpda.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):
        if main(args) != 0:
            raise RuntimeError(f"dpda {' '.join(args)} failed")
    return dict(json.loads(out.read_text()))


def consortium_cell(data_dir: str, target: str, seed: int, epsilon: float) -> dict[str, Any]:
    """One leave-one-domain-out job at ``seed`` and ``epsilon`` per source, through the CLI."""
    sources = [d for d in DOMAINS if d != target]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        args = ["simulate", "--data-dir", data_dir, "--dataset", "office-caltech"]
        for s in sources:
            args += ["--source", s]
        args += ["--target", target, "--seed", str(seed), "--epsilon", f"{epsilon:g}"]
        args += ["--references", "--predictions", str(Path(tmp) / "p.csv"), "--json", str(out)]
        data = _simulated(args, out)
    acc = data["accuracy"]
    return {
        "target": target,
        "sources": sources,
        "seed": seed,
        "epsilon": epsilon,
        **{k: acc.get(k) for k in ("dpda", "kept", "dp_no_adaptation")},
        **{k: acc.get(k) for k in ("source_only", "source_only_logistic", "otda")},
        "epsilon_spent_by_source": data["epsilon_spent_by_source"],
        "missing": data["consortium"]["missing"],
        "choice_kept": (data.get("choice") or {}).get("kept"),
    }


def several_cell(name: str, seed: int, epsilon: float) -> dict[str, Any]:
    """One job of the development suite's several-source family ``name`` at ``seed``, through
    the CLI on the family's tables written as CSV files: ``dpda simulate --source-file S1
    --source-file S2 --source-file S3 --target-file T --label-column label --representation R
    --references``."""
    from dpda.data.devsuite import SEVERAL, SEVERAL_REPRESENTATION, write_csv

    sources, target = SEVERAL[name](seed)
    with tempfile.TemporaryDirectory() as tmp:
        args = ["simulate"]
        for part, d in [*sources.items(), ("target", target)]:
            path = write_csv(d, Path(tmp) / f"{part}.csv")
            args += ["--target-file" if part == "target" else "--source-file", str(path)]
        out = Path(tmp) / "run.json"
        args += ["--label-column", "label", "--seed", str(seed), "--epsilon", f"{epsilon:g}"]
        args += ["--representation", SEVERAL_REPRESENTATION[name], "--references"]
        data = _simulated([*args, "--json", str(out)], out)
    acc = data["accuracy"]
    return {
        "family": name,
        "seed": seed,
        "epsilon": epsilon,
        **{k: acc.get(k) for k in COLUMNS},
        "epsilon_spent_by_source": data["epsilon_spent_by_source"],
        "choice_kept": (data.get("choice") or {}).get("kept"),
    }


def run_several(pool: Any, seeds: int, epsilon: float) -> dict[str, Any]:
    """Every several-source family of the development suite at every seed."""
    from dpda.data.devsuite import SEVERAL

    cells = gather(
        [pool.submit(several_cell, name, seed, epsilon)
         for name in SEVERAL for seed in range(seeds)],
        "several-source development runs",
    )  # fmt: skip
    table = summarize_several(cells)
    print_several(table, epsilon)
    return {"epsilon": epsilon, "runs": cells, "table": table}


def summarize_several(cells: list[dict[str, Any]]) -> dict[str, Any]:
    """Per family (in the order the cells first name them): the means over seeds of
    ``COLUMNS`` and the largest ε any source spent."""
    table: dict[str, Any] = {}
    for name in dict.fromkeys(c["family"] for c in cells):
        runs = [c for c in cells if c["family"] == name]
        table[name] = {k: mean_of([r[k] for r in runs]) for k in COLUMNS}
        table[name]["largest_epsilon_spent"] = max(
            max(r["epsilon_spent_by_source"].values()) for r in runs
        )
    return table


def print_several(table: dict[str, Any], epsilon: float) -> None:
    print(f"\nSeveral-source development families, ε = {epsilon:g} at each (mean over seeds)")
    print(f"{'family':<14} {'DPDA':>6} {'kept':>6} {'pooled':>7} {'1-NN':>6} {'LR':>6} "
          f"{'OTDA':>6}  max ε")  # fmt: skip
    for name, r in table.items():
        print(
            f"{name:<14} {cell(r['dpda']):>6} {cell(r['kept']):>6} "
            f"{cell(r['dp_no_adaptation']):>7} {cell(r['source_only']):>6} "
            f"{cell(r['source_only_logistic']):>6} {cell(r['otda']):>6}  "
            f"{r['largest_epsilon_spent']:.3f}"
        )


def single_cell(data_dir: str, source: str, target: str, seed: int, epsilon: float) -> dict:
    """One source's own job on the same seed with the job's defaults: its kept model."""
    from dpda.data.loaders import load_domain
    from dpda.data.preprocessing import DEFAULT_REPRESENTATION
    from dpda.dp.ledger import default_delta
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import SessionTerms

    ds = "office-caltech"
    s, t = load_domain(data_dir, ds, source), load_domain(data_dir, ds, target)
    terms = SessionTerms(dataset=f"{ds}:{source}", epsilon=epsilon,
                         delta=default_delta(s.x.shape[0]))  # fmt: skip
    out = simulate(s, t, terms, DEFAULT_REPRESENTATION[ds], AdaptConfig(seed=seed), seed,
                   baselines=False)  # fmt: skip
    return {"source": source, "target": target, "seed": seed, "epsilon": epsilon,
            "kept": out.to_json(terms)["accuracy"]["kept"]}  # fmt: skip


def run_consortium(pool: Any, data_dir: str, seeds: int, epsilon: float) -> dict[str, Any]:
    """Every leave-one-domain-out task at every seed, and the one-source jobs beside them."""
    cells = gather(
        [pool.submit(consortium_cell, data_dir, t, seed, epsilon)
         for t in DOMAINS for seed in range(seeds)],
        "consortium runs",
    )  # fmt: skip
    singles = gather(
        [pool.submit(single_cell, data_dir, s, t, seed, epsilon)
         for t in DOMAINS for s in DOMAINS if s != t for seed in range(seeds)],
        "one-source runs",
    )  # fmt: skip
    table = summarize_consortium(cells, singles)
    print_consortium(table, epsilon)
    return {"epsilon": epsilon, "runs": cells, "single_source": singles, "table": table}


def summarize_consortium(cells: list[dict], singles: list[dict]) -> dict[str, Any]:
    """Per task: the means over seeds, the best one-source job (the best source's mean kept
    model), and on how many tasks the kept model is at least each bar."""
    tasks: dict[str, Any] = {}
    for t in DOMAINS:
        runs = [c for c in cells if c["target"] == t]
        if not runs:
            continue
        row: dict[str, Any] = {k: mean_of([r[k] for r in runs]) for k in COLUMNS}
        by_source = {
            s: mean_of([r["kept"] for r in singles if r["source"] == s and r["target"] == t])
            for s in runs[0]["sources"]
        }
        best = max(by_source, key=lambda s: by_source[s] or 0.0)
        row.update(
            single_source_kept=by_source,
            best_single_source=best,
            best_single_source_kept=by_source[best],
            largest_epsilon_spent=max(max(r["epsilon_spent_by_source"].values()) for r in runs),
            seeds=len(runs),
        )
        tasks["+".join(runs[0]["sources"]) + "→" + t] = row
    return {
        "tasks": tasks,
        "kept_at_least_best_single_source": sum(
            _at_least(r["kept"], r["best_single_source_kept"]) for r in tasks.values()
        ),
        "kept_at_least_pooled_no_adaptation": sum(
            _at_least(r["kept"], r["dp_no_adaptation"]) for r in tasks.values()
        ),
        "n_tasks": len(tasks),
    }


def _at_least(a: float | None, b: float | None) -> bool:
    """``a ≥ b`` for two means of accuracies: equal counts of right rows summed in another
    order differ in the last bits, so within 1e-9 is equal."""
    return (a or 0.0) >= (b or 0.0) - 1e-9


def print_consortium(table: dict[str, Any], epsilon: float) -> None:
    print(f"\nSeveral sources, leave one domain out, ε = {epsilon:g} at each (mean over seeds)")
    print(f"{'task':<10} {'DPDA':>6} {'kept':>6} {'pooled':>7} {'best 1':>7} {'1-NN':>6} "
          f"{'LR':>6} {'OTDA':>6}  max ε")  # fmt: skip
    for name, r in table["tasks"].items():
        print(
            f"{name:<10} {cell(r['dpda']):>6} {cell(r['kept']):>6} "
            f"{cell(r['dp_no_adaptation']):>7} {cell(r['best_single_source_kept']):>7} "
            f"{cell(r['source_only']):>6} {cell(r['source_only_logistic']):>6} "
            f"{cell(r['otda']):>6}  {r['largest_epsilon_spent']:.3f}"
        )
    n = table["n_tasks"]
    print(
        f"kept ≥ the best single-source job on {table['kept_at_least_best_single_source']}/{n}; "
        f"≥ the pooled releases without adaptation on "
        f"{table['kept_at_least_pooled_no_adaptation']}/{n}"
    )
