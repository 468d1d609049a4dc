"""Subcommands of the two daemons and their state: keys, serve, run, ledger, audit."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from dpda.errors import LedgerCorrupt
from dpda.service.output import add_json_option, json_to_stdout, write_json
from dpda.service.verify import (
    STANDALONE_LIMITS,
    compare_with_peer,
    open_state,
    role_keys,
    verify_ledger,
)


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _cmd_keys_init(args: argparse.Namespace) -> int:
    from dpda.service.tls import init_party

    keys = init_party(
        Path(args.out), args.org, Path(args.ca) if args.ca else None, tuple(args.host)
    )
    print(f"certificate      {keys.cert}")
    print(f"TLS key          {keys.key}  (keep private)")
    print(f"CA certificate   {keys.ca}  (give to the peer as its peer_ca)")
    print(f"signing key      {keys.signing_key}  (keep private)")
    print(f"signing pub key  {keys.signing_pub}  (give to the peer)")
    print(f"fingerprint      {keys.fingerprint}  (the peer pins this)")
    return 0


def _cmd_source_serve(args: argparse.Namespace) -> int:
    from dpda.service.config import load_source
    from dpda.source_party.app import serve

    _setup_logging(args.log_level)
    cfg = load_source(args.config)
    return serve(cfg)


def _cmd_target_run(args: argparse.Namespace) -> int:
    from dpda.service.config import load_target
    from dpda.target_party.app import run

    _setup_logging(args.log_level)
    cfg = load_target(args.config)
    out = run(cfg, progress=not args.quiet, settle=True)
    if out.get("setting") == "public-source":
        print(
            f"{out['method']}: {out['steps']} private steps by the data holder; ε this job "
            f"{out['epsilon_job']:.4f}, the holder's dataset in all {out['epsilon_spent']:.4f}  "
            f"weights keep ≈{out['weights_effective_rows']:.0f} rows  → {out['output_dir']}"
        )
        print(f"  weights: {out['weights']}  model: {out.get('model', 'linear predictor')}")
        print(f"  note: protected are {out['protected']}")
        write_json(args, out)
        return 0
    acc = "n/a" if out["accuracy"] is None else f"{out['accuracy']:.2f}%"
    print(
        f"job {out['job_id']}: accuracy {acc}  {out['batches']} release(s), "
        f"{out['rows_received']} rows  → {out['output_dir']}"
    )
    if "epsilon_job_by_source" in out:  # a job over several sources: each one's own ε
        for name, eps in out["epsilon_job_by_source"].items():
            if eps is None:
                continue  # left the job: said below
            print(
                f"  source {name}'s records: ε {eps:.4f} this job, its dataset's total "
                f"{out['epsilon_spent_by_source'][name]:.4f} (δ={out['delta']:.3g})"
            )
        for name, why in out["consortium"]["missing"].items():
            print(f"  source {name} is missing from the job: {why}")
    else:
        print(
            f"  the source's records: ε {out['epsilon_job']:.4f} this job, the dataset's total "
            f"{out['epsilon_dataset_total']:.4f} (δ={out['delta']:.3g})"
        )
    if out.get("target_disclosures") == "none":
        print("  the target's own rows: ε 0, nothing of them was sent (a source-space release)")
    elif out.get("target_epsilon_spent") is None:
        print("  the target's own rows: ε 0, its statistics went out exact ([privacy] opt-in)")
    else:
        print(
            f"  the target's own rows: ε {out['target_epsilon_spent']:.4f} this job, its total "
            f"{out['target_epsilon_total']:.4f} of privacy.epsilon_cap "
            f"{cfg.privacy.epsilon_cap:g}"
        )
    print(f"  predictions: {out['predictions']}  model: {out['model']}")
    print(f"  note: {out['caveat']}")
    write_json(args, out)
    return 0


def _cmd_target_plan(args: argparse.Namespace) -> int:
    from dpda.service.config import load_target
    from dpda.target_party.planning import plan_job

    _setup_logging(args.log_level)
    cfg = load_target(args.config)
    out = plan_job(cfg)
    by = out["epsilon_remaining_by_cap"]
    print(
        f"σ/w {out['sigma']:.4f} (noise std {out['noise_std']:.4g}), {out['steps']} release(s), "
        f"ℓ = {out['projection_dim']}, {out['privacy_unit']} unit"
    )
    own = out["target"]
    print(
        f"this job would charge the source's records ε {out['epsilon_charge']:.4f} "
        f"(δ = {out['delta']:.3g}); the source dataset's total would go to "
        f"{out['epsilon_dataset_after']:.4f} of its cap {out['epsilon_dataset_cap']:.4g}"
    )
    if own["delta"] is None:
        print("  and the target's own rows ε 0: its statistics go out exact ([privacy] opt-in)")
    else:
        print(
            f"  and the target's own rows ε {own['epsilon_charge']:.4f} (δ = {own['delta']:.3g}"
            f", [privacy]); their total would go to {own['epsilon_total_after']:.4f} of the "
            f"target's cap {own['epsilon_cap']:.4g} (privacy.epsilon_cap)"
        )
    ch = out["epsilon_by_channel"]
    print(
        f"  by channel, each alone: features {ch['features']:.4f}, histogram "
        f"{ch['histogram']:.4f}, PATE {ch['pate']:.4f}, the source's DP standardization "
        f"{ch['preprocessing']:.4f} (composed, they make the charge above)"
    )
    print(
        f"remaining now on the source's dataset: its cap {by['source_dataset']:.4f}, this "
        f"peer's cap at the source {by['source_peer']:.4f}, the target's cap for it "
        f"(budget_epsilon) {by['target_budget']:.4f}"
    )
    fc = out["forecast"]
    print(
        f"forecast: noise-to-signal of a {fc['per']} {fc['noise_to_signal']:.3f} "
        f"({fc['rows_per_class']:.0f} rows per class on average); "
        + (
            "noise-dominated: expect little better than chance. " + " ".join(fc["advice"])
            if fc["noise_dominated"]
            else f"under the noise-dominated line {fc['threshold']:g}"
        )
    )
    if out["target"].get("epsilon_charge") == 0.0:
        print("the target sends nothing about its rows for this job: its own ε is 0")
    res = out["resources"]
    print(
        f"resources (an estimate from the shapes, calibrated on 2 cores): peak memory about "
        f"{res['peak_memory_mb']:.0f} MB, about {res['seconds']:.0f} s, linear in the target's "
        f"rows ({res['plan_entries_per_fit']} plan entries a fit, {res['fits']} fits)"
    )
    print(
        "it fits; nothing was spent by this plan"
        if out["fits"]
        else "it does NOT fit (nothing was spent by this plan): "
        + "; ".join(_overdrawn(out, cfg.budget_epsilon))
    )
    write_json(args, out)
    return 0 if out["fits"] else 1


def _overdrawn(plan: dict, budget_epsilon: float) -> list[str]:
    """Each budget the planned job would overdraw: whose it is and the setting that holds it."""
    by, after = plan["epsilon_remaining_by_cap"], plan["epsilon_dataset_after"]
    charge = plan["epsilon_charge"]
    out = []
    if after > plan["epsilon_dataset_cap"] + 1e-12:
        out.append("the source dataset's budget (its epsilon, at the source) would be exceeded")
    if charge > by["source_peer"] + 1e-12:
        out.append("this peer's budget at the source (its peers.epsilon_cap) would be exceeded")
    if after > budget_epsilon + 1e-12:
        out.append("the target's own budget for the dataset (budget_epsilon) would be exceeded")
    if not plan["target"]["fits"]:
        out.append("the target's own budget for its rows (privacy.epsilon_cap) would be exceeded")
    return out or ["a budget would be exceeded (see the remaining budget above)"]


def _cmd_target_serve(args: argparse.Namespace) -> int:
    from dpda.service.config import load_target
    from dpda.target_party.jobs import serve

    _setup_logging(args.log_level)
    cfg = load_target(args.config)
    return serve(cfg)


# ------------------------------------------------------------------------- ledger / audit
def _cmd_ledger_show(args: argparse.Namespace) -> int:
    _, store = open_state(args.state_dir)
    rows = [json.loads(e.to_json()) for e in store.entries()]
    write_json(args, rows)
    if json_to_stdout(args):
        return 0
    print(
        f"{'dataset':<24} {'seq':>4} {'peer':<14} {'unit':<9} {'request':<40} {'ε after':>9} signed"
    )
    for r in rows:
        signed = ("S" if r["source_sig"] else "-") + ("T" if r["target_sig"] else "-")
        print(
            f"{r['dataset']:<24} {r['seq']:>4} {r['peer']:<14} {r['privacy_unit']:<9} "
            f"{r['request_id'][:40]:<40} {r['spend_after']:>9.4f} {signed}"
        )
    from dpda.dp.ledger import totals_by_relation

    for ds in store.datasets():
        t = totals_by_relation(store.entries(ds))
        rec = t["record"]
        record = "unbounded (attribute-unit releases)" if rec is None else f"{rec:.4f}"
        print(
            f"{ds}: ε for one feature of one record {t['attribute']:.4f}; "
            f"for a whole record {record}"
        )
    if args.config:
        for line in _budget_lines(args.config, store):
            print(line)
    return 0


def _budget_lines(config: str, store: Any) -> list[str]:
    """Each cap of the daemon's config, what the dataset's total (composed) has spent against
    it, and what remains — the dataset's running total, not any one job's cost."""
    import tomllib

    from dpda.dp.events import event_from_json
    from dpda.dp.ledger import spend_of

    with open(config, "rb") as fh:
        raw = tomllib.load(fh)
    lines = []
    if "datasets" in raw:  # a source
        from dpda.service.config import load_source

        cfg = load_source(config)
        for ds in cfg.datasets:
            entries = store.entries(ds.name)
            delta = entries[0].params.get("delta") if entries else ds.delta
            events = [event_from_json(e.dp_event) for e in entries]
            spent = spend_of(events, delta) if events and delta else 0.0
            lines.append(
                f"{ds.name}: dataset cap ε {ds.epsilon:g}, spent {spent:.4f} (all peers and "
                f"sessions), remaining {max(ds.epsilon - spent, 0.0):.4f}"
            )
            for p in cfg.peers:
                mine = [event_from_json(e.dp_event) for e in entries if e.peer == p.name]
                ps = spend_of(mine, delta) if mine and delta else 0.0
                lines.append(
                    f"  peer {p.name}: cap ε {p.epsilon_cap:g}, spent {ps:.4f}, remaining "
                    f"{max(p.epsilon_cap - ps, 0.0):.4f}"
                )
    else:  # a target
        from dpda.service.config import load_target

        tcfg = load_target(config)
        held = store.entries(tcfg.job.dataset)
        events = [event_from_json(e.dp_event) for e in held]
        tdelta = tcfg.job.delta or (held[0].params.get("delta") if held else None)
        spent = spend_of(events, tdelta) if events and tdelta else 0.0
        lines.append(
            f"{tcfg.job.dataset}: the target's budget ε {tcfg.budget_epsilon:g}, the dataset's "
            f"total {spent:.4f}, remaining {max(tcfg.budget_epsilon - spent, 0.0):.4f}"
        )
    return lines


def _cmd_ledger_verify(args: argparse.Namespace) -> int:
    problems, warnings, n = verify_ledger(args.state_dir)
    if args.against:
        problems += compare_with_peer(args.state_dir, args.against)
    else:
        print(f"note: {STANDALONE_LIMITS}")
    for w in warnings:
        print(f"warning: {w}")
    for p in problems:
        print(f"FAIL: {p}")
    print(f"{n} ledger entries checked: {'OK' if not problems else 'TAMPERED'}")
    return 0 if not problems else 1


def _ledger_index(store) -> dict[tuple[str, int], Any]:
    return {(e.dataset, e.seq): e for e in store.entries()}


def _cmd_audit_verify(args: argparse.Namespace) -> int:
    from dpda.service.audit import AuditLog, verify

    conn, store = open_state(args.state_dir)
    log = AuditLog(conn, "")
    try:
        own = role_keys(args.state_dir).own
        problems = verify(log, _ledger_index(store), own)
    except LedgerCorrupt as exc:  # no keys.json: the signatures cannot be checked
        problems = [str(exc), *verify(log, _ledger_index(store))]
    for p in problems:
        print(f"FAIL: {p}")
    print(f"{len(log.records())} audit records checked: {'OK' if not problems else 'TAMPERED'}")
    return 0 if not problems else 1


def _cmd_audit_report(args: argparse.Namespace) -> int:
    from dpda.service.audit import AuditLog, report

    conn, store = open_state(args.state_dir)
    rep = report(AuditLog(conn, ""), _ledger_index(store))
    write_json(args, rep)
    if json_to_stdout(args):
        return 0
    print(f"audit report ({rep['side']} side, {rep['records']} records)")
    print("messages sent by this organization:")
    for m, d in sorted(rep["outgoing_by_method"].items()):
        print(f"  {m:<16} {d['messages']:>5} messages {d['bytes']:>12,} bytes")
    for d in rep["releases_by_dataset"].values():
        print(
            f"DP releases of {d['dataset']} ({d['mechanism']}): {d['releases']}, "
            f"{d['bytes']:,} bytes; dataset ε after the last one {d['epsilon']:.4f}"
        )
    if rep["disclosures"]:
        print("what this target disclosed about its own rows:")
    for d in rep["disclosures"]:
        eps = "not protected" if d["epsilon"] is None else f"ε {d['epsilon']:.4g}"
        print(f"  {d['method']:<16} {d['what']}: {d['mechanism']}, {eps}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the service subcommands to the ``dpda`` parser."""
    k = sub.add_parser("keys", help="make certificates and signing keys")
    ksub = k.add_subparsers(dest="keys_command", required=True)
    ki = ksub.add_parser("init", help="CA-signed TLS key pair + Ed25519 signing key for a party")
    ki.add_argument("--org", required=True, help="party name (certificate common name)")
    ki.add_argument("--out", required=True, help="output directory (never inside a checkout)")
    ki.add_argument("--ca", default=None, help="existing CA directory (default: make one)")
    ki.add_argument(
        "--host",
        action="append",
        default=["localhost"],
        help="host name or IP the certificate is valid for (repeatable)",
    )
    ki.set_defaults(func=_cmd_keys_init)

    s = sub.add_parser("source", help="the source daemon")
    ssub = s.add_subparsers(dest="source_command", required=True)
    ss = ssub.add_parser("serve", help="serve DP releases over gRPC with mTLS")
    ss.add_argument("--config", required=True, help="source.toml")
    ss.add_argument("--log-level", default="info", help="debug, info (default), warning or error")
    ss.set_defaults(func=_cmd_source_serve)

    t = sub.add_parser("target", help="the target party")
    tsub = t.add_subparsers(dest="target_command", required=True)
    tr = tsub.add_parser("run", help="one DPDA job against the configured source")
    tr.add_argument("--config", required=True, help="target.toml")
    add_json_option(tr)
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.add_argument(
        "--log-level", default="warning", help="debug, info (default), warning or error"
    )
    tr.set_defaults(func=_cmd_target_run)
    tp = tsub.add_parser(
        "plan", help="preflight: σ, this job's charge and the budget left, spending nothing"
    )
    tp.add_argument("--config", required=True, help="target.toml")
    add_json_option(tp)
    tp.add_argument(
        "--log-level", default="warning", help="debug, info (default), warning or error"
    )
    tp.set_defaults(func=_cmd_target_plan)

    tv = tsub.add_parser("serve", help="the target daemon: jobs over its admin HTTP API")
    tv.add_argument("--config", required=True, help="target.toml")
    tv.add_argument("--log-level", default="info", help="debug, info (default), warning or error")
    tv.set_defaults(func=_cmd_target_serve)

    lg = sub.add_parser("ledger", help="inspect a daemon's privacy ledger")
    lsub = lg.add_subparsers(dest="ledger_command", required=True)
    ls = lsub.add_parser("show", help="list ledger entries")
    ls.add_argument("state_dir", help="the daemon's state_dir (its ledger and audit log)")
    ls.add_argument(
        "--config",
        default=None,
        help="the daemon's source.toml or target.toml: also print each cap, what it has "
        "spent and what remains",
    )
    add_json_option(ls)
    ls.set_defaults(func=_cmd_ledger_show)
    lv = lsub.add_parser("verify", help="check chain, signatures, charges and payload hashes")
    lv.add_argument("state_dir", help="the daemon's state_dir (its ledger and audit log)")
    lv.add_argument(
        "--against",
        metavar="PEER_STATE_DIR",
        help="also compare with the peer's copy (detects a lost or truncated tail)",
    )
    lv.set_defaults(func=_cmd_ledger_verify)

    au = sub.add_parser("audit", help="inspect a daemon's payload audit log")
    asub = au.add_subparsers(dest="audit_command", required=True)
    av = asub.add_parser("verify", help="check the chain and ledger coverage of every release")
    av.add_argument("state_dir", help="the daemon's state_dir (its ledger and audit log)")
    av.set_defaults(func=_cmd_audit_verify)
    ar = asub.add_parser("report", help="what left the organization, by mechanism, bytes, ε")
    ar.add_argument("state_dir", help="the daemon's state_dir (its ledger and audit log)")
    add_json_option(ar)
    ar.set_defaults(func=_cmd_audit_report)
