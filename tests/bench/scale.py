"""``dpda bench scale``: the VisDA-scale job with every target row in every batch's plan, its
per-batch fits as Dask tasks on a ``LocalCluster`` of 1, then 2 workers of this machine —
seconds, throughput per worker and the parallel efficiency.

Each worker runs one Dask thread with one BLAS thread, and the job's own process (releases,
the final classifier) is held to one BLAS thread too, so the ratio of the two runs measures how
the fits scale, not how BLAS pools share cores. Each run is a fresh process with a fresh
cluster. Besides the wall time of the job, the workers' task stream gives the busy seconds of
the fits: their mean is the measured per-batch cost the README's 10^6 × 10^6 plan starts from.
Each row also carries what the fits read (kernel builds, passes, bytes) and the time those reads
take at the read bandwidth measured in the same process (``tests.bench.speed.fit_bounds``).
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from typing import Any

from dpda.service.output import add_json_option, write_json
from tests.bench.bandwidth import memory_bandwidth_gbs
from tests.bench.speed import (
    _in_child,
    _rss_mb,
    _status_mb,
    fit_bounds,
    job_inputs,
    print_fits,
)

FULL = {"n_source": 150_000, "n_target": 50_000, "dim": 256, "batch_size": 1000, "steps": 150}
# under 3 minutes on 1 worker of this machine (2 cores) even when other work shares it: README,
# "Past one machine" (30,000 × 10,000 and 30 batches took 288 s at load 7)
QUICK = {"n_source": 20_000, "n_target": 8_000, "dim": 256, "batch_size": 1000, "steps": 20}


def _scale_child(spec: dict[str, Any], workers: int, conn) -> None:
    from distributed import get_task_stream
    from threadpoolctl import threadpool_limits

    from dpda.simulation import simulate
    from dpda.target_party.compute import ComputeSpec, open_compute

    bw = memory_bandwidth_gbs(mb=512, repeats=3)  # the bound the fits are compared with
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    src, tgt, terms, cfg = job_inputs({**spec, "target_batch": 0})
    data_s = time.perf_counter() - t0
    memory = spec.get("memory_per_worker")
    with (
        threadpool_limits(limits=1),
        open_compute(ComputeSpec("local", workers, memory, 1)) as compute,
    ):
        client = compute.client  # type: ignore[attr-defined]
        stop = threading.Event()
        watch = threading.Thread(
            target=_watch, args=(client, spec["steps"], stop, spec["watch_s"]), daemon=True
        )
        watch.start()
        t1 = time.perf_counter()
        with get_task_stream(client) as ts:
            out = simulate(
                src, tgt, terms, "raw", cfg, seed=spec["seed"], baselines=False, compute=compute
            )
        seconds = time.perf_counter() - t1
        stop.set()
        fits = [
            s["stop"] - s["start"]
            for t in ts.data
            if str(t["key"]).startswith("_limited-")
            for s in t["startstops"]
            if s["action"] == "compute"
        ]
        starts = [
            s["start"]
            for t in ts.data
            if str(t["key"]).startswith("_limited-")
            for s in t["startstops"]
            if s["action"] == "compute"
        ]
        stops = [
            s["stop"]
            for t in ts.data
            if str(t["key"]).startswith("_limited-")
            for s in t["startstops"]
            if s["action"] == "compute"
        ]
    d = out.dpda
    conn.send(
        {
            "workers": workers,
            "seconds": seconds,
            "batches": d.n_batches,
            "accuracy": d.accuracy,
            "epsilon_spent": d.epsilon_spent,
            "rows_received": d.rows_received,
            "solver_converged": d.solver_converged,
            "data_seconds": data_s,
            "fit_tasks": len(fits),
            "fit_busy_seconds": sum(fits),
            "fit_span_seconds": (max(stops) - min(starts)) if fits else 0.0,
            "per_batch_seconds": sum(fits) / max(d.n_batches, 1),
            "job_peak_mb": _status_mb("VmHWM") or _rss_mb(),
            "load_before": list(load_before),
            "load_after": list(os.getloadavg()),
            **fit_bounds(d.fit_traffic.to_json(), bw),
        }
    )
    conn.close()


def _watch(client: Any, steps: int, stop: threading.Event, every: float) -> None:
    """Print the fits finished so far every ``every`` seconds (a long run's progress)."""
    t0 = time.perf_counter()
    while not stop.wait(every):
        try:
            held = sum(
                1 for ks in client.has_what().values() for k in ks if str(k).startswith("_limited-")
            )
        except Exception:  # the cluster is closing
            return
        print(
            f"  … {held}/{steps} fits done after {time.perf_counter() - t0:.0f} s, "
            f"load {os.getloadavg()[0]:.1f}",
            flush=True,
        )


def scale_rows(spec: dict[str, Any], workers: list[int], done: Any = None) -> list[dict[str, Any]]:
    """One row per worker count, each run in a fresh process; ``done(rows)`` after each."""
    rows: list[dict[str, Any]] = []
    for w in workers:
        rows.append(_in_child(_scale_child, spec, w))
        _derive(rows)
        if done is not None:
            done(rows)
    return rows


def _derive(rows: list[dict[str, Any]]) -> None:
    """Throughput per worker, and efficiency against the 1-worker row (once it is there)."""
    base = next((r for r in rows if r["workers"] == 1), None)
    for r in rows:
        r["throughput_batches_per_s_per_worker"] = r["batches"] / r["seconds"] / r["workers"]
        r["efficiency"] = base["seconds"] / (r["workers"] * r["seconds"]) if base else None
        r["fit_efficiency"] = (
            base["fit_span_seconds"] / (r["workers"] * r["fit_span_seconds"])
            if base and r["fit_span_seconds"]
            else None
        )


def _print(rows: list[dict[str, Any]]) -> None:
    print(
        f"{'workers':>7} {'seconds':>9} {'batches':>7} {'accuracy':>8} {'s/batch':>8} "
        f"{'fits span':>9} {'batch/s/worker':>14} {'efficiency':>10} {'load':>10}"
    )
    for r in rows:
        eff = "" if r["efficiency"] is None else f"{r['efficiency']:.2f}"
        acc = "" if r["accuracy"] is None else f"{r['accuracy']:.2f}"
        print(
            f"{r['workers']:>7} {r['seconds']:>9.1f} {r['batches']:>7} {acc:>8} "
            f"{r['per_batch_seconds']:>8.2f} {r['fit_span_seconds']:>9.1f} "
            f"{r['throughput_batches_per_s_per_worker']:>14.4f} {eff:>10} "
            f"{r['load_before'][0]:>4.1f}→{r['load_after'][0]:<4.1f}",
            flush=True,
        )
    for r in rows:
        print(f"{r['workers']} worker(s):", end="")
        print_fits(r)


def run_bench_scale(args: argparse.Namespace) -> int:
    if args.rows is not None:
        from tests.bench.rows import run_rows

        return run_rows(args)
    base = dict(QUICK if args.quick else FULL)
    for key in ("n_source", "n_target", "dim", "batch_size", "steps"):
        value = getattr(args, key)
        if value is not None:
            base[key] = value
    spec = {
        **base,
        "projection_dim": 20,
        "epsilon": 8.0,
        "classifier": "logistic",
        "seed": 0,
        "memory_per_worker": args.memory_per_worker,
        "watch_s": args.watch_s,
    }
    print(
        f"{'quick' if args.quick else 'VisDA-scale'} job: {spec['n_source']} source × "
        f"{spec['n_target']} target rows, {spec['dim']}-d synthetic, Poisson minibatches of "
        f"{spec['batch_size']}, {spec['steps']} steps, every target row in every batch's plan, "
        "logistic regression; LocalCluster, 1 Dask thread and 1 BLAS thread per worker",
        flush=True,
    )

    def done(rows: list[dict[str, Any]]) -> None:  # a long run keeps what it has measured
        complete = len(rows) == len(args.workers)
        if not complete and args.json == "-":
            return  # standard output gets one document
        write_json(args, {"spec": spec, "cpus": os.cpu_count(), "complete": complete, "rows": rows})

    rows = scale_rows(spec, args.workers, done)
    _print(rows)
    return 0


def register_scale(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser(
        "scale",
        help="the VisDA-scale job, every target row in every batch, on 1 and 2 Dask workers",
    )
    s.add_argument(
        "--quick",
        action="store_true",
        help="20,000 × 8,000 rows, 20 batches (under 3 minutes on 1 worker)",
    )
    s.add_argument(
        "--workers",
        type=int,
        nargs="+",
        default=[1, 2],
        help="Dask worker counts to compare (default 1 2)",
    )
    s.add_argument(
        "--n-source",
        dest="n_source",
        type=int,
        default=None,
        help="source rows (default: the VisDA scale, or --quick's)",
    )
    s.add_argument(
        "--n-target",
        dest="n_target",
        type=int,
        default=None,
        help="target rows (default: the VisDA scale, or --quick's)",
    )
    s.add_argument(
        "--dim", type=int, default=None, help="features per row (default: the VisDA scale)"
    )
    s.add_argument(
        "--batch-size",
        dest="batch_size",
        type=int,
        default=None,
        help="Poisson batch size (default: the VisDA scale's)",
    )
    s.add_argument(
        "--steps",
        type=int,
        default=None,
        help="minibatches (default: the VisDA scale's, or --quick's)",
    )
    s.add_argument(
        "--memory-per-worker",
        type=int,
        default=None,
        help="bytes per worker (default: Dask's share of this machine's memory)",
    )
    s.add_argument("--watch-s", type=float, default=60.0, help="progress line every this often")
    s.add_argument(
        "--rows",
        type=int,
        nargs="*",
        default=None,
        metavar="N",
        help="instead: wall time and peak memory of dpda simulate on synthetic 10-class "
        "tables of 64 columns, N rows a side, the rehearsal (references) and the job alone "
        "(default N: 10000 100000 1000000)",
    )
    s.add_argument(
        "--kinds",
        nargs="+",
        choices=["rehearsal", "job"],
        default=["rehearsal", "job"],
        help="with --rows: which runs (default both)",
    )
    s.add_argument(
        "--rehearsal-max",
        dest="rehearsal_max",
        type=int,
        default=100_000,
        help="with --rows: the largest N the rehearsal runs at (its 1-NN reference's time "
        "grows as the product of the rows; default 100000)",
    )
    s.add_argument("--seed", type=int, default=0, help="with --rows: the tables' and noise's seed")
    s.add_argument(
        "--source-rows",
        dest="source_rows",
        type=int,
        default=None,
        help="with --rows: this many source rows at every N (default N: as many as the target)",
    )
    add_json_option(s)
    s.set_defaults(func=run_bench_scale)
