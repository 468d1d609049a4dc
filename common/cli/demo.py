"""``dpda demo``: the zero-setup main job.

Makes throw-away keys, starts the source daemon as its own process on loopback (mTLS, port 0),
runs the target job as a second process against it on a generated two-domain problem, then
verifies both ledgers and audit logs and prints accuracy, ε spent and what left the source.
``--in-process`` runs the same job code without the daemons.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from dpda.dp.ledger import default_delta
from dpda.errors import ConfigError
from dpda.service.output import write_json

DEMO_DELTA = default_delta(600)  # 1/(10·ns), the default policy's δ
DEMO_TARGET_EPSILON = 4.0  # the target's own default ε for its disclosures


def _in_process(args: argparse.Namespace) -> dict[str, Any]:
    from dpda.data.synthetic import two_domains
    from dpda.service.progress import Progress
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import SessionTerms

    src, tgt = two_domains()
    terms = SessionTerms(
        dataset="synthetic", epsilon=args.epsilon, delta=DEMO_DELTA, projection_dim=10
    )
    out = simulate(src, tgt, terms, "raw", AdaptConfig(), seed=None, progress=Progress("releases"))
    data = out.to_json(terms)
    data.update({"mode": "in-process", "ledger_verified": None, "audit_verified": None})
    return data


def _two_daemons(dep: Any, workdir: Path, serving: str, result: str) -> dict[str, Any]:
    """The serving daemon as its own process, the job as a second one; the job's results."""
    from dpda.deployment import SourceProcess, run_target

    print(f"  keys and configs in {workdir}")
    src = SourceProcess(dep)
    print(f"  {serving} (pid {src.proc.pid}) listening on 127.0.0.1:{src.port} with mTLS")
    try:
        res = run_target(dep, "--json", str(workdir / result))
    finally:
        src.stop()
    if res.returncode != 0:
        raise RuntimeError(f"the job failed:\n{res.stderr.strip()}")
    return dict(json.loads((workdir / result).read_text()))


def _verified(state_dir: Path) -> tuple[bool, bool]:
    """(the ledger verifies and is not empty, the audit log verifies) for one side."""
    from dpda.deployment import dpda_command
    from dpda.service.verify import verify_ledger

    problems, _, n = verify_ledger(str(state_dir))
    audit = subprocess.run(
        dpda_command("audit", "verify", str(state_dir)), capture_output=True, text=True
    )
    return (not problems and n > 0, audit.returncode == 0)


def _dataset(args: argparse.Namespace) -> dict[str, Any]:
    """The source's generated dataset, its cap the demo's ε."""
    return {"name": "synthetic", "kind": "synthetic", "epsilon": args.epsilon, "delta": DEMO_DELTA}


def _job(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    """The target's job on the generated rows at the demo's ε, with ``extra`` settings."""
    return {
        "dataset": "synthetic",
        "data_kind": "synthetic",
        "epsilon": args.epsilon,
        "delta": DEMO_DELTA,
        **extra,
    }


def _service(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    from dpda.deployment import dpda_command, make_deployment

    dep = make_deployment(
        workdir,
        dataset=_dataset(args),
        job=_job(args, projection_dim=10),
        peer_cap=args.epsilon,
        target_budget=args.epsilon,
        # the target's default policy: its scaling and basis under its own DP where a release
        # needs them (the generated rows are raw, so their norm bound is given: every row is
        # below 15)
        target_privacy={"row_clip": 15.0, "epsilon": DEMO_TARGET_EPSILON},
    )
    data = _two_daemons(dep, workdir, "source daemon", "target-result.json")
    checks = {side: _verified(workdir / side) for side in ("source", "target")}
    report = subprocess.run(
        dpda_command("audit", "report", str(workdir / "source"), "--json"),
        capture_output=True,
        text=True,
        check=True,
    )
    data.update(
        {
            "mode": "service",
            "workdir": str(workdir),
            "ledger_verified": all(c[0] for c in checks.values()),
            "audit_verified": all(c[1] for c in checks.values()),
            "audit_report": json.loads(report.stdout),
        }
    )
    return data


def _consortium(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """``--sources N``: N organizations' source daemons (each its own keys, CA, ledger and
    process, each trusting the one target) and one target job over all of them, in per-row L2
    rows (a source-space release, what a job over several sources combines)."""
    from dpda.deployment import (
        SourceProcess,
        add_sources,
        make_deployment,
        run_target,
        trust_target_of,
    )

    names = [f"org-{chr(ord('a') + k)}" for k in range(args.sources)]
    deps = {
        n: make_deployment(
            workdir / n,
            dataset=_dataset(args),
            job=_job(args, representation="l2"),
            peer_cap=args.epsilon,
            target_budget=args.epsilon,
        )
        for n in names
    }
    target = deps[names[0]]
    for n in names[1:]:
        trust_target_of(deps[n], target)
    print(f"  keys and configs in {workdir}")
    procs: dict[str, Any] = {}
    try:
        for n in names:
            procs[n] = SourceProcess(deps[n])
            print(f"  {n}'s source daemon (pid {procs[n].proc.pid}) on 127.0.0.1:{procs[n].port}")
        add_sources(
            target, names[0], {n: (deps[n], f"127.0.0.1:{procs[n].port}") for n in names[1:]}
        )
        res = run_target(target, "--json", str(workdir / "target-result.json"))
    finally:
        for p in procs.values():
            p.stop()
    if res.returncode != 0:
        raise RuntimeError(f"the job failed:\n{res.stderr.strip()}")
    data = dict(json.loads((workdir / "target-result.json").read_text()))
    checks = {}
    for n in names:  # each source's ledger, and the target's copy of it
        checks[n] = _verified(deps[n].source_state)
        checks[f"target/{n}"] = _verified(target.target_state / "sources" / n)
    data.update(
        {
            "mode": "service",
            "workdir": str(workdir),
            "ledger_verified": all(c[0] for c in checks.values()),
            "audit_verified": all(c[1] for c in checks.values()),
        }
    )
    return data


def _public_source(args: argparse.Namespace, workdir: Path) -> int:
    """The public-source deployment: the daemon holds the 500 private, unlabeled target
    rows and answers the private steps under its own ledger; the job holds the 600 public
    labeled rows, drives the reweighting and trains the model."""
    from dpda.data.synthetic import two_domains
    from dpda.deployment import make_deployment
    from dpda.target_party.training import accuracy, load_model

    delta = default_delta(500)
    dep = make_deployment(
        workdir,
        dataset={
            "name": "private-rows",
            "kind": "synthetic",
            "domain": "target",
            "epsilon": args.epsilon,
            "delta": delta,
            "policy": {"allow_reweighting": True},
        },
        job={
            "dataset": "private-rows",
            "data_kind": "synthetic",
            "setting": "public-source",
            "epsilon": args.epsilon,
            "delta": delta,
            "reweighting_steps": 300,
        },
        peer_cap=args.epsilon,
        target_budget=args.epsilon,
    )
    data = _two_daemons(dep, workdir, "data holder daemon", "driver-result.json")
    ok = all(all(_verified(workdir / side)) for side in ("source", "target"))
    # only the demo knows the holder's labels: a real holder runs the model on its own rows
    from sklearn.base import clone

    public, tgt = two_domains()
    assert tgt.y is not None
    model = load_model(data["model"])
    acc = accuracy(model.predict(tgt.x), tgt.y)
    alone = accuracy(clone(model).fit(public.x, public.y).predict(tgt.x), tgt.y)  # no weights
    print(
        f"  {data['steps']} private {data['method']} steps answered by the holder; "
        f"ε spent {data['epsilon_spent']:.3f} of {args.epsilon} at δ={delta:.3g} (its rows)"
    )
    print(
        f"  on the holder's rows (the demo knows their labels): weighted {acc:.1f}%, the public "
        f"rows alone {alone:.1f}%"
    )
    print(f"  ledgers and audit logs verified on both sides: {ok}")
    print(f"  inspect: dpda ledger show {workdir}/source ; cat {data['weights']}")
    data.update({"mode": "service", "workdir": str(workdir), "verified": ok, "accuracy": acc})
    data["accuracy_source_only"] = alone
    write_json(args, data)
    return 0 if ok else 1


def run_demo(args: argparse.Namespace) -> int:
    if getattr(args, "setting", "private-source") == "public-source":
        print(
            "dpda demo — the public-source setting: 600 public labeled rows, 500 private unlabeled "
            "rows held by the daemon (40 features, 5 classes)"
        )
        workdir = (
            Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dpda-demo-"))
        )
        return _public_source(args, workdir)
    print(
        "dpda demo — a synthetic two-domain problem (600 labeled source rows, 500 target rows,"
        " 40 features, 5 classes)"
    )
    sources = getattr(args, "sources", 1)
    if sources > 1:
        if args.in_process:
            raise ConfigError("--sources: the several sources run as daemons (no --in-process)")
        workdir = (
            Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dpda-demo-"))
        )
        data = _consortium(args, workdir)
        print(f"  target accuracy over {sources} sources: {data['accuracy']:.1f}%")
        for name, eps in data["epsilon_job_by_source"].items():
            if eps is not None:
                print(f"  {name}: ε {eps:.3f} of {args.epsilon} on its own records, its own ledger")
        for name, why in data["consortium"]["missing"].items():
            print(f"  {name} left the job: {why}")
        print(
            f"  ledgers verified (each source's and the target's copy of it): "
            f"{data['ledger_verified']}, audit logs verified: {data['audit_verified']}"
        )
        print(f"  inspect: dpda ledger show {workdir}/org-b/source")
        write_json(args, data)
        return 0 if data["ledger_verified"] and data["audit_verified"] else 1
    if args.in_process:
        data = _in_process(args)
    else:
        workdir = (
            Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="dpda-demo-"))
        )
        data = _service(args, workdir)
    acc = data["accuracy"]
    acc_txt = acc["dpda"] if isinstance(acc, dict) else acc
    print(f"  target accuracy with DPDA: {acc_txt:.1f}%")
    print(
        f"  ε spent {data['epsilon_spent']:.3f} of {args.epsilon} at δ={DEMO_DELTA:.3g} "
        f"({data['privacy_unit']} unit, {data['neighbouring']}, {data['release']}) on the "
        "source's records"
    )
    if data.get("target_disclosures") == "none":
        print("  the target sent nothing about its rows (a source-space release): its ε is 0")
    elif data.get("target_epsilon_spent") is not None:
        print(
            f"  the target spent ε {data['target_epsilon_spent']:.3f} on its own rows: its "
            "column scaling and basis went out under its own DP"
        )
    if data["mode"] == "service":
        rep = data["audit_report"]
        for d in rep["releases_by_dataset"].values():
            print(
                f"  audit: {d['releases']} DP release(s) of '{d['dataset']}' "
                f"({d['mechanism']}) left the source, {d['bytes']:,} bytes, "
                f"dataset ε {d['epsilon']:.3f}"
            )
        sent = sum(m["bytes"] for m in rep["outgoing_by_method"].values())
        print(
            f"  audit: {sent:,} bytes sent by the source in total; ledgers verified: "
            f"{data['ledger_verified']}, audit logs verified: {data['audit_verified']}"
        )
        print(
            f"  inspect: dpda ledger show {data['workdir']}/source ; "
            f"dpda audit report {data['workdir']}/target"
        )
    print(f"  note: {data['caveat']}")
    write_json(args, data)
    ok = data["mode"] == "in-process" or (data["ledger_verified"] and data["audit_verified"])
    return 0 if ok else 1
