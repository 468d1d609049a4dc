"""``dpda bench service``: the same DPDA job in-process and through the two daemons.

Three arms run in the same invocation on the same data with the same seed, ``--repeats``
times each, alternated (so a slow spell of a shared machine hits all of them), and their
medians compared:

* **in-process, fresh process** (the baseline of ``ratio``): the job called directly against
  ``SourceReleaser`` in a process of its own, as the service's ``dpda target run`` is one and
  the source daemon is freshly started — every arm's caches start cold;
* **service**: ``dpda source serve`` as a process (mTLS, SQLite ledger, audit log on) and
  ``dpda target run`` as another;
* **in-process, warm** (``ratio_vs_warm``): the job repeated in this process after an untimed
  run, every cache warm — what a service whose processes are fresh cannot have.

Every process of every arm runs its linear algebra on ``--blas-threads`` threads (default 1:
two parties sharing one small machine would otherwise fight over its cores, as parties on their
own machines do not; 0 leaves the libraries' default).

The job time of each (opening the session to the results, every charge countersigned, as
measured inside the job; the channel's teardown after it is not counted), the whole-process
wall time of the service arm, the ratios and the bytes on the wire (from both audit logs) are
printed and written as JSON; each arm's job time also split into its calls to the source
(``source_seconds``: opening, releases, closing, and waiting for the charges to be checked)
and the rest, the target's own compute (``target_seconds``: the same arithmetic in every arm;
in-process it also holds setting up the view and the releaser, which the service does before
its job starts).
Beside ``ratio`` (service median over fresh in-process median):
``ratio_interval``, a 90% bootstrap interval of that ratio, and
``ratio_paired``, the median of the run-by-run ratios (each service run over the fresh run
just before it, which a slow spell hits alike).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dpda.dp.mechanisms import PrivacyUnit
from dpda.service.output import add_json_option, write_json
from tests.bench.harness import add_data_dir, child_env


def _in_process(src, tgt, terms, rep: str, scaling: str, seed: int) -> dict[str, Any]:
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig

    t0 = time.perf_counter()
    out = simulate(
        src, tgt, terms, rep, AdaptConfig(), seed=seed, baselines=False, scaling_mode=scaling
    )
    return {
        "seconds": time.perf_counter() - t0,
        "source_seconds": out.dpda.source_seconds,
        "accuracy": out.dpda.accuracy,
        "epsilon_spent": out.dpda.epsilon_spent,
    }


def _inputs(spec: dict[str, Any]) -> tuple[Any, ...]:
    """(source, target, terms, representation, scaling, source dataset table, target job
    table) of one case: built alike in this process and in a fresh one (``in_process_child``)."""
    from dpda.data.loaders import load_domain
    from dpda.data.synthetic import two_domains
    from dpda.terms import SessionTerms

    if spec["case"] == "office":
        src = load_domain(spec["data_dir"], "office-caltech", "C")
        tgt = load_domain(spec["data_dir"], "office-caltech", "A")
        delta = 1 / (1.2 * src.x.shape[0])
        terms = SessionTerms(dataset="C", epsilon=8.0, delta=delta)
        common = {"representation": "sqrt", "epsilon": 8.0, "delta": delta}
        dataset = {"name": "C", "kind": "office-caltech", "path": spec["data_dir"],
                   "domain": "C", **common}  # fmt: skip
        job = {"dataset": "C", "data_kind": "office-caltech", "data_path": spec["data_dir"],
               "domain": "A", **common}  # fmt: skip
        return src, tgt, terms, "sqrt", "zscore", dataset, job
    n, batch, steps = spec["rows"], spec["batch_size"], spec["steps"]
    src, tgt = two_domains(n, n)
    delta = 1 / (1.2 * n)
    terms = SessionTerms(
        dataset="syn",
        epsilon=8.0,
        delta=delta,
        projection_dim=10,
        batch_size=batch,
        steps=steps,
        privacy_unit=PrivacyUnit.ATTRIBUTE,
    )
    dataset = {
        "name": "syn",
        "kind": "synthetic",
        "synthetic_rows": [n, n],
        "epsilon": 8.0,
        "delta": delta,
        "policy": {
            "units": ["attribute"],
            "attribute_unit_exposes_labels_and_membership": True,
            "releases": ["rows"],
        },
    }
    job = {
        "dataset": "syn",
        "data_kind": "synthetic",
        "synthetic_rows": [n, n],
        "epsilon": 8.0,
        "delta": delta,
        "projection_dim": 10,
        "batch_size": batch,
        "steps": steps,
        "privacy_unit": "attribute",
    }
    return src, tgt, terms, "raw", "zscore", dataset, job


def in_process_child(spec_json: str) -> None:
    """One in-process job in this (fresh) process; prints its JSON on the last line."""
    from dpda.service import settle_heap

    spec = json.loads(spec_json)
    src, tgt, terms, rep, scaling, _, _ = _inputs(spec)
    settle_heap()  # as ``dpda target run`` does once its data is loaded
    print(json.dumps(_in_process(src, tgt, terms, rep, scaling, spec["seed"])), flush=True)


def _in_process_fresh(spec: dict[str, Any]) -> dict[str, Any]:
    """The in-process job in a process of its own, as ``dpda target run`` is one: its caches
    (the accountant's compositions, first calls) start as cold as the service's do."""
    code = "import sys; from tests.bench.service import in_process_child as c; c(sys.argv[1])"
    r = subprocess.run(
        [sys.executable, "-c", code, json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=3600,
        env=child_env(),
    )
    if r.returncode != 0:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def _service(workdir: Path, dataset: dict, job: dict, seed: int) -> dict[str, Any]:
    from dpda.deployment import SourceProcess, make_deployment, run_target
    from dpda.service.audit import AuditLog, report
    from dpda.service.ledger_store import connect

    dep = make_deployment(
        workdir,
        dataset=dataset,
        job=job,
        source_extra={"seed": seed, "insecure_testing": True},
        target_privacy={"disclosures": "exact"},  # as the in-process arm discloses
    )
    src = SourceProcess(dep)
    t0 = time.perf_counter()
    try:
        res = run_target(dep, "--json", str(workdir / "result.json"), timeout=3600)
    finally:
        wall = time.perf_counter() - t0
        src.stop()
    if res.returncode != 0:
        raise RuntimeError(res.stderr[-2000:])
    out = json.loads((workdir / "result.json").read_text())
    wire = 0
    for side in ("source", "target"):
        rep = report(AuditLog(connect(workdir / side / "state.sqlite"), side), {})
        wire += sum(m["bytes"] for m in rep["outgoing_by_method"].values())
    return {
        "seconds": out["job_seconds"],
        "source_seconds": out["source_seconds"],
        "process_wall_seconds": wall,
        "accuracy": out["accuracy"],
        "epsilon_spent": out["epsilon_spent"],
        "bytes_on_wire": wire,
    }


def _arm(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians of an arm's runs: the job; of it, the calls to the source; the rest, the
    target's own compute (the same arithmetic in every arm)."""
    return {
        "seconds": float(np.median([r["seconds"] for r in runs])),
        "source_seconds": float(np.median([r["source_seconds"] for r in runs])),
        "target_seconds": float(np.median([r["seconds"] - r["source_seconds"] for r in runs])),
        "runs": runs,
        "accuracy": runs[0]["accuracy"],
        "epsilon_spent": runs[0]["epsilon_spent"],
    }


def _case(name: str, spec: dict[str, Any], root: Path, repeats: int) -> dict[str, Any]:
    """Three arms, alternated run by run (a slow spell of a shared machine hits all three):
    the in-process job in a fresh process; the service (a fresh source daemon and ``dpda
    target run``, each a fresh process); the in-process job again in this process, after one
    untimed run, its caches warm."""
    src, tgt, terms, rep_name, scaling, dataset, job = _inputs(spec)
    seed = spec["seed"]
    fresh: list[dict[str, Any]] = []
    svc: list[dict[str, Any]] = []
    warm: list[dict[str, Any]] = []
    _in_process(src, tgt, terms, rep_name, scaling, seed)  # warms this process's caches
    for rep in range(repeats):
        print(f"[{name}] in-process, fresh process, run {rep + 1}/{repeats} …", flush=True)
        fresh.append(_in_process_fresh(spec))
        print(f"[{name}] service (two daemons, mTLS, ledger + audit), run {rep + 1} …", flush=True)
        svc.append(_service(root / f"{name} #{rep}", dataset, job, seed))
        print(f"[{name}] in-process, warm (this process), run {rep + 1} …", flush=True)
        warm.append(_in_process(src, tgt, terms, rep_name, scaling, seed))
    a, w = _arm(fresh), _arm(warm)
    b = {
        **_arm(svc),
        "process_wall_seconds": float(np.median([r["process_wall_seconds"] for r in svc])),
        "bytes_on_wire": svc[0]["bytes_on_wire"],
    }
    ratio, ratio_warm = b["seconds"] / a["seconds"], b["seconds"] / w["seconds"]
    s_sec = [r["seconds"] for r in svc]
    f_sec = [r["seconds"] for r in fresh]
    paired = float(np.median([x / y for x, y in zip(s_sec, f_sec, strict=True)]))
    low, high = ratio_interval(s_sec, f_sec)
    print(
        f"[{name}] median of {repeats}: in-process {a['seconds']:.3f} s (fresh process) / "
        f"{w['seconds']:.3f} s (warm) | service {b['seconds']:.3f} s (processes "
        f"{b['process_wall_seconds']:.2f} s) | ratio {ratio:.3f} (90% bootstrap interval "
        f"{low:.3f}–{high:.3f}; run by run {paired:.3f}; vs warm {ratio_warm:.3f}) | "
        f"{b['bytes_on_wire']:,} bytes on the wire | accuracy {a['accuracy']:.2f} vs "
        f"{b['accuracy']:.2f}\n[{name}] of which calls to the source: in-process "
        f"{a['source_seconds'] * 1e3:.1f} ms (fresh) / {w['source_seconds'] * 1e3:.1f} ms (warm) | "
        f"service {b['source_seconds'] * 1e3:.1f} ms; the target's own compute: "
        f"{a['target_seconds'] * 1e3:.1f} / {w['target_seconds'] * 1e3:.1f} | "
        f"{b['target_seconds'] * 1e3:.1f} ms",
        flush=True,
    )
    return {
        "case": name,
        "repeats": repeats,
        "in_process": a,
        "in_process_warm": w,
        "service": b,
        "ratio": ratio,
        "ratio_interval": [low, high],
        "ratio_paired": paired,
        "ratio_vs_warm": ratio_warm,
        "same_result": all(r["accuracy"] == a["accuracy"] for r in fresh + svc + warm),
    }


def ratio_interval(
    service: list[float], baseline: list[float], resamples: int = 2000, level: float = 0.90
) -> tuple[float, float]:
    """Percentile bootstrap interval of median(service) / median(baseline), each arm's runs
    resampled on their own (fixed seed: the same runs give the same interval). With a handful
    of runs an arm's median moves by its spread, so the ratio alone does not say whether a bar
    is met; the interval does, as far as the runs can."""
    rng = np.random.default_rng(0)
    s, b = np.asarray(service, dtype=float), np.asarray(baseline, dtype=float)
    si = rng.integers(0, s.size, (resamples, s.size))
    bi = rng.integers(0, b.size, (resamples, b.size))
    ratios = np.median(s[si], axis=1) / np.median(b[bi], axis=1)
    tail = (1.0 - level) / 2.0
    lo, hi = np.quantile(ratios, [tail, 1.0 - tail])
    return float(lo), float(hi)


BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def run_bench_service(args: argparse.Namespace) -> int:
    """With ``--blas-threads N`` (default 1) every process of every arm runs its linear
    algebra on N threads: two parties on one small machine would otherwise each start a BLAS
    thread per core and fight over the cores, which parties on their own machines do not."""
    from threadpoolctl import threadpool_limits

    if args.blas_threads > 0:
        os.environ.update({k: str(args.blas_threads) for k in BLAS_ENV})  # the child processes
        with threadpool_limits(limits=args.blas_threads):  # this process's warm arm
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from dpda.data.loaders import default_data_dir

    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dpda-bench-"))
    results = []
    data_dir = args.data_dir or default_data_dir()
    if data_dir is not None and not args.skip_office:
        spec = {"case": "office", "data_dir": str(data_dir), "seed": 0}
        results.append(_case("office-caltech C->A", spec, root, args.repeats))
    n = args.synthetic_rows
    spec = {"case": "synthetic", "rows": n, "batch_size": args.batch_size, "steps": args.steps,
            "seed": 0}  # fmt: skip
    results.append(_case(f"synthetic {n}x{n}", spec, root, args.repeats))
    out = {
        "benchmark": "service",
        "blas_threads": args.blas_threads or None,
        "cases": results,
        "workdir": str(root),
    }
    write_json(args, out)
    return 0


def register_service(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser("service", help="the same DPDA job in-process and through the daemons")
    add_json_option(s)
    add_data_dir(s)
    s.add_argument("--workdir", default=None, help="keep the deployments here")
    s.add_argument("--skip-office", action="store_true", help="run the synthetic case only")
    s.add_argument(
        "--synthetic-rows",
        type=int,
        default=20_000,
        help="rows of the synthetic case (default 20,000)",
    )
    s.add_argument("--batch-size", type=int, default=500, help="Poisson batch size (default 500)")
    s.add_argument("--steps", type=int, default=4, help="minibatches per job (default 4)")
    s.add_argument(
        "--repeats",
        type=int,
        default=9,
        help="runs of each arm, alternated; medians compared, with a bootstrap interval",
    )
    s.add_argument(
        "--blas-threads",
        type=int,
        default=1,
        help="BLAS threads of every process of every arm (0: the libraries' default)",
    )
    s.set_defaults(func=run_bench_service)
