"""``dpda bench service``: the same DPDA job in-process and through the two daemons.

Both arms run in the same invocation on the same data with the same seed, ``--repeats`` times
each, alternated (so a slow spell of a shared machine hits both), and their medians compared:
the in-process arm calls the job directly against ``SourceReleaser``; the service arm starts
``dpda source serve`` as a process (mTLS, SQLite ledger, audit log on) and runs ``dpda target
run`` as another. The job time of each (opening the session to the results, every charge
countersigned, as measured inside the job; the channel's teardown after it is not counted), the
whole-process wall time of the service arm, their ratio and the bytes on the wire (from both
audit logs) are printed and written as JSON.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dpda.dp.mechanisms import PrivacyUnit
from dpda.service.output import add_json_option, write_json


def _in_process(src, tgt, terms, rep: str, scaling: str, seed: int) -> dict[str, Any]:
    from dpda.simulation import simulate
    from dpda.target_party.pipeline import AdaptConfig

    t0 = time.perf_counter()
    out = simulate(
        src, tgt, terms, rep, AdaptConfig(), seed=seed, baselines=False, scaling_mode=scaling
    )
    return {
        "seconds": time.perf_counter() - t0,
        "accuracy": out.dpda.accuracy,
        "epsilon_spent": out.dpda.epsilon_spent,
    }


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
        "process_wall_seconds": wall,
        "accuracy": out["accuracy"],
        "epsilon_spent": out["epsilon_spent"],
        "bytes_on_wire": wire,
    }


def _case(
    name: str,
    src,
    tgt,
    terms,
    dataset: dict,
    job: dict,
    rep_name: str,
    scaling: str,
    seed: int,
    root: Path,
    repeats: int,
) -> dict[str, Any]:
    ins: list[dict[str, Any]] = []
    svc: list[dict[str, Any]] = []
    for rep in range(repeats):  # alternated, so a slow spell of the machine hits both arms
        print(f"[{name}] in-process, run {rep + 1}/{repeats} …", flush=True)
        ins.append(_in_process(src, tgt, terms, rep_name, scaling, seed))
        print(f"[{name}] service (two daemons, mTLS, ledger + audit), run {rep + 1} …", flush=True)
        svc.append(_service(root / f"{name} #{rep}", dataset, job, seed))
    a = {
        "seconds": float(np.median([r["seconds"] for r in ins])),
        "runs": ins,
        "accuracy": ins[0]["accuracy"],
        "epsilon_spent": ins[0]["epsilon_spent"],
    }
    b = {
        **svc[0],
        "seconds": float(np.median([r["seconds"] for r in svc])),
        "runs": svc,
        "process_wall_seconds": float(np.median([r["process_wall_seconds"] for r in svc])),
    }
    ratio = b["seconds"] / a["seconds"]
    print(
        f"[{name}] median of {repeats}: in-process {a['seconds']:.2f} s | service "
        f"{b['seconds']:.2f} s (processes {b['process_wall_seconds']:.2f} s) | ratio "
        f"{ratio:.3f} | {b['bytes_on_wire']:,} bytes on the wire | accuracy "
        f"{a['accuracy']:.2f} vs {b['accuracy']:.2f}",
        flush=True,
    )
    return {
        "case": name,
        "repeats": repeats,
        "in_process": a,
        "service": b,
        "ratio": ratio,
        "same_result": all(r["accuracy"] == a["accuracy"] for r in ins + svc),
    }


def run_bench_service(args: argparse.Namespace) -> int:
    from dpda.data.loaders import default_data_dir, load_domain
    from dpda.data.synthetic import two_domains
    from dpda.terms import SessionTerms

    root = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dpda-bench-"))
    results = []
    seed = 0
    data_dir = args.data_dir or default_data_dir()
    if data_dir is not None and not args.skip_office:
        src = load_domain(data_dir, "office-caltech", "C")
        tgt = load_domain(data_dir, "office-caltech", "A")
        delta = 1 / (1.2 * src.x.shape[0])
        terms = SessionTerms(dataset="C", epsilon=8.0, delta=delta)
        dataset = {
            "name": "C",
            "kind": "office-caltech",
            "path": str(data_dir),
            "domain": "C",
            "representation": "sqrt",
            "epsilon": 8.0,
            "delta": delta,
        }
        job = {
            "dataset": "C",
            "data_kind": "office-caltech",
            "data_path": str(data_dir),
            "domain": "A",
            "representation": "sqrt",
            "epsilon": 8.0,
            "delta": delta,
        }
        results.append(
            _case(
                "office-caltech C->A",
                src,
                tgt,
                terms,
                dataset,
                job,
                "sqrt",
                "zscore",
                seed,
                root,
                args.repeats,
            )
        )
    n = args.synthetic_rows
    src, tgt = two_domains(n, n)
    delta = 1 / (1.2 * n)
    terms = SessionTerms(
        dataset="syn",
        epsilon=8.0,
        delta=delta,
        projection_dim=10,
        batch_size=args.batch_size,
        steps=args.steps,
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
        "batch_size": args.batch_size,
        "steps": args.steps,
        "privacy_unit": "attribute",
    }
    results.append(
        _case(
            f"synthetic {n}x{n}",
            src,
            tgt,
            terms,
            dataset,
            job,
            "raw",
            "zscore",
            seed,
            root,
            args.repeats,
        )
    )
    out = {"benchmark": "service", "cases": results, "workdir": str(root)}
    write_json(args, out)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser("bench", help="benchmarks that print numbers and write JSON")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    s = bsub.add_parser("service", help="the same DPDA job in-process and through the daemons")
    add_json_option(s)
    s.add_argument("--data-dir", default=None)
    s.add_argument("--workdir", default=None, help="keep the deployments here")
    s.add_argument("--skip-office", action="store_true")
    s.add_argument("--synthetic-rows", type=int, default=20_000)
    s.add_argument("--batch-size", type=int, default=500)
    s.add_argument("--steps", type=int, default=4)
    s.add_argument(
        "--repeats", type=int, default=3, help="runs of each arm, alternated; medians compared"
    )
    s.set_defaults(func=run_bench_service)
    from dpda.bench.accuracy import register_accuracy
    from dpda.bench.figures import register_figures
    from dpda.bench.load import register_load
    from dpda.bench.metric import register_metric
    from dpda.bench.privacy import register_privacy
    from dpda.bench.public_source import register_public_source
    from dpda.bench.releases import register_releases
    from dpda.bench.scale import register_scale
    from dpda.bench.selection import register_selection
    from dpda.bench.speed import register_speed
    from dpda.bench.target_privacy import register_target_privacy

    register_speed(bsub)
    register_accuracy(bsub)
    register_figures(bsub)
    register_privacy(bsub)
    register_selection(bsub)
    register_load(bsub)
    register_releases(bsub)
    register_public_source(bsub)
    register_target_privacy(bsub)
    register_scale(bsub)
    register_metric(bsub)
