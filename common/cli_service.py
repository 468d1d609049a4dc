"""Subcommands of the two daemons and their state: keys, serve, run, ledger, audit."""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ConfigError, LedgerCorrupt


def _setup_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def _cmd_keys_init(args: argparse.Namespace) -> int:
    from .tls import init_party

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
    from source_party.app import serve

    from .config import load_source

    _setup_logging(args.log_level)
    cfg = load_source(args.config)
    return serve(cfg)


def _cmd_target_run(args: argparse.Namespace) -> int:
    from target_party.app import run

    from .config import load_target

    _setup_logging(args.log_level)
    cfg = load_target(args.config)
    out = run(cfg, progress=not args.quiet)
    acc = "n/a" if out["accuracy"] is None else f"{out['accuracy']:.2f}%"
    print(
        f"accuracy {acc}  ε spent {out['epsilon_spent']:.4f} (δ={out['delta']:.3g})  "
        f"{out['batches']} release(s), {out['rows_received']} rows  → {cfg.state_dir}"
    )
    print(f"  note: {out['caveat']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return 0


def _cmd_target_serve(args: argparse.Namespace) -> int:
    from target_party.jobs import serve

    from .config import load_target

    _setup_logging(args.log_level)
    cfg = load_target(args.config)
    return serve(cfg)


# ------------------------------------------------------------------------- ledger / audit
def _open_state(state_dir: str):  # noqa: ANN202
    from .dp.ledger_store import SqliteLedgerStore, connect

    path = Path(state_dir) / "state.sqlite"
    if not path.is_file():
        raise ConfigError(f"{state_dir}: no dpda state here (state.sqlite missing)")
    conn = connect(path)
    return conn, SqliteLedgerStore(path, conn)


@dataclass(frozen=True)
class RoleKeys:
    """The signing keys of a state directory, bound to their roles (``keys.json``)."""

    side: str
    own: Any
    peers: dict[str, Any]

    def source_key(self, peer: str) -> Any:
        return self.own if self.side == "source" else self.peers.get("source")

    def target_key(self, peer: str) -> Any:
        return self.peers.get(peer) if self.side == "source" else self.own


def _role_keys(state_dir: str) -> RoleKeys:
    """Keys by role. A missing or unreadable ``keys.json`` is a verification failure, never a
    reason to skip the signature checks (9ac3bc1 skipped them silently)."""
    from cryptography.hazmat.primitives import serialization

    f = Path(state_dir) / "keys.json"
    if not f.is_file():
        raise LedgerCorrupt(f"{f}: missing, so no signature can be checked")
    try:
        data = json.loads(f.read_text())
        side = data["side"]
        own = serialization.load_pem_public_key(data["self"].encode())
        peers = {
            n: serialization.load_pem_public_key(p.encode()) for n, p in data["peers"].items()
        }
    except (KeyError, ValueError, TypeError, AttributeError):
        raise LedgerCorrupt(f"{f}: unreadable, so no signature can be checked") from None
    if side not in ("source", "target"):
        raise LedgerCorrupt(f"{f}: side must be source or target")
    return RoleKeys(side, own, peers)


def verify_ledger(state_dir: str) -> tuple[list[str], list[str], int]:
    """(problems, warnings, entries checked) for a daemon's state directory.

    Each signature is checked against its role's key only: the source's against the source's,
    the countersignature against that peer's (on 9ac3bc1 any known key passed for either role,
    so the source could forge every countersignature)."""
    from . import signing
    from .dp.accounting import ledger_epsilon
    from .dp.events import canonical_json, event_from_json
    from .dp.ledger import verify_chain

    conn, store = _open_state(state_dir)
    problems: list[str] = []
    warnings: list[str] = []
    try:
        keys: RoleKeys | None = _role_keys(state_dir)
    except LedgerCorrupt as exc:
        problems.append(str(exc))
        keys = None
    n = 0
    payloads: dict[tuple[str, int], str] = {}
    has_payloads = conn.execute("SELECT name FROM sqlite_master WHERE name='payloads'").fetchone()
    if has_payloads:
        for ds, seq, z, c in conn.execute("SELECT dataset, seq, z, counts FROM payloads"):
            payloads[(ds, seq)] = hashlib.sha256(z + c).hexdigest()
    for ds in store.datasets():
        entries = store.entries(ds)
        n += len(entries)
        try:
            verify_chain(entries)
        except LedgerCorrupt as exc:
            problems.append(f"{ds}: {exc}")
        groups: dict[str, list[Any]] = {}  # the running groups: verify is linear
        for e in entries:
            key = canonical_json(e.dp_event)
            if key in groups:
                groups[key][1] += 1
            else:
                groups[key] = [event_from_json(e.dp_event), 1]
            delta = e.params.get("delta")
            if delta:
                spent = ledger_epsilon([(k, ev, c) for k, (ev, c) in groups.items()], delta)
                if abs(spent - e.spend_after) > 1e-9:
                    problems.append(f"{ds} entry {e.seq}: spend_after differs from recomputation")
            msg = e.signed_message()
            if e.payload_sha256 and not e.source_sig:
                warnings.append(f"{ds} entry {e.seq}: not yet signed by the source")
            for role, sig in (("source", e.source_sig), ("target", e.target_sig)):
                if not sig or keys is None:
                    continue
                key = keys.source_key(e.peer) if role == "source" else keys.target_key(e.peer)
                if key is None:
                    problems.append(f"{ds} entry {e.seq}: no {role} key for peer {e.peer!r}")
                elif not signing.verify(key, msg, sig):
                    problems.append(f"{ds} entry {e.seq}: bad {role} signature")
            if e.payload_sha256 and not e.target_sig:
                warnings.append(f"{ds} entry {e.seq}: not countersigned by the target")
            stored = payloads.get((ds, e.seq))
            if stored is not None and stored != e.payload_sha256:
                problems.append(f"{ds} entry {e.seq}: stored payload does not match its hash")
    return problems, warnings, n


def _cmd_ledger_show(args: argparse.Namespace) -> int:
    _, store = _open_state(args.state_dir)
    rows = [json.loads(e.to_json()) for e in store.entries()]
    if args.json:
        print(json.dumps(rows, indent=2))
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
    from .dp.ledger import totals_by_relation

    for ds in store.datasets():
        t = totals_by_relation(store.entries(ds))
        rec = t["record"]
        record = "unbounded (attribute-unit releases)" if rec is None else f"{rec:.4f}"
        print(
            f"{ds}: ε for one feature of one record {t['attribute']:.4f}; "
            f"for a whole record {record}"
        )
    return 0


def compare_with_peer(state_dir: str, peer_state_dir: str) -> list[str]:
    """Problems found comparing a ledger with the peer's copy of it. Each side keeps the head
    the other signed, so a tail lost on one side (with its audit records, or with a WAL) shows
    as a strict prefix of the other's copy."""
    _, mine = _open_state(state_dir)
    _, theirs = _open_state(peer_state_dir)
    problems: list[str] = []
    for ds in sorted(set(theirs.datasets())):
        a, b = mine.entries(ds), theirs.entries(ds)
        common = min(len(a), len(b))
        if [e.entry_hash() for e in a[:common]] != [e.entry_hash() for e in b[:common]]:
            problems.append(f"{ds}: the two copies of the ledger diverge")
        elif len(a) < len(b):
            signed = sum(1 for e in b[len(a) :] if e.source_sig and e.target_sig)
            problems.append(
                f"{ds}: {len(b) - len(a)} entries the peer holds ({signed} signed by both) are "
                "missing here: a lost or truncated tail"
            )
    return problems


def _cmd_ledger_verify(args: argparse.Namespace) -> int:
    problems, warnings, n = verify_ledger(args.state_dir)
    if args.against:
        problems += compare_with_peer(args.state_dir, args.against)
    for w in warnings:
        print(f"warning: {w}")
    for p in problems:
        print(f"FAIL: {p}")
    print(f"{n} ledger entries checked: {'OK' if not problems else 'TAMPERED'}")
    return 0 if not problems else 1


def _ledger_index(store) -> dict[tuple[str, int], Any]:  # noqa: ANN001
    return {(e.dataset, e.seq): e for e in store.entries()}


def _cmd_audit_verify(args: argparse.Namespace) -> int:
    from .audit import AuditLog, verify

    conn, store = _open_state(args.state_dir)
    log = AuditLog(conn, "")
    try:
        own = _role_keys(args.state_dir).own
        problems = verify(log, _ledger_index(store), own)
    except LedgerCorrupt as exc:  # no keys.json: the signatures cannot be checked
        problems = [str(exc), *verify(log, _ledger_index(store))]
    for p in problems:
        print(f"FAIL: {p}")
    print(f"{len(log.records())} audit records checked: {'OK' if not problems else 'TAMPERED'}")
    return 0 if not problems else 1


def _cmd_audit_report(args: argparse.Namespace) -> int:
    from .audit import AuditLog, report

    conn, store = _open_state(args.state_dir)
    rep = report(AuditLog(conn, ""), _ledger_index(store))
    if args.json:
        print(json.dumps(rep, indent=2))
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
    return 0


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
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
    ss.add_argument("--log-level", default="info")
    ss.set_defaults(func=_cmd_source_serve)

    t = sub.add_parser("target", help="the target party")
    tsub = t.add_subparsers(dest="target_command", required=True)
    tr = tsub.add_parser("run", help="one DPDA job against the configured source")
    tr.add_argument("--config", required=True, help="target.toml")
    tr.add_argument("--json", default=None, metavar="OUT")
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    tr.add_argument("--log-level", default="warning")
    tr.set_defaults(func=_cmd_target_run)

    tv = tsub.add_parser("serve", help="the target daemon: jobs over its admin HTTP API")
    tv.add_argument("--config", required=True, help="target.toml")
    tv.add_argument("--log-level", default="info")
    tv.set_defaults(func=_cmd_target_serve)

    lg = sub.add_parser("ledger", help="inspect a daemon's privacy ledger")
    lsub = lg.add_subparsers(dest="ledger_command", required=True)
    ls = lsub.add_parser("show", help="list ledger entries")
    ls.add_argument("state_dir")
    ls.add_argument("--json", action="store_true")
    ls.set_defaults(func=_cmd_ledger_show)
    lv = lsub.add_parser("verify", help="check chain, signatures, charges and payload hashes")
    lv.add_argument("state_dir")
    lv.add_argument(
        "--against",
        metavar="PEER_STATE_DIR",
        help="also compare with the peer's copy (detects a lost or truncated tail)",
    )
    lv.set_defaults(func=_cmd_ledger_verify)

    au = sub.add_parser("audit", help="inspect a daemon's payload audit log")
    asub = au.add_subparsers(dest="audit_command", required=True)
    av = asub.add_parser("verify", help="check the chain and ledger coverage of every release")
    av.add_argument("state_dir")
    av.set_defaults(func=_cmd_audit_verify)
    ar = asub.add_parser("report", help="what left the organization, by mechanism, bytes, ε")
    ar.add_argument("state_dir")
    ar.add_argument("--json", action="store_true")
    ar.set_defaults(func=_cmd_audit_report)
