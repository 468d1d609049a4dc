"""Offline checks of a daemon's state directory: the ledger's chain, every recomputed spend,
each signature against its role's key, stored payloads against their hashes, and a comparison
with the peer's copy (``dpda ledger verify [--against PEER_STATE]``)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dpda.errors import ConfigError, LedgerCorrupt


def open_state(state_dir: str):
    """(connection, ledger store) of a state dir, opened for reading only: the offline checks
    change nothing, and a read-only copy works (or the error says why)."""
    import sqlite3

    from dpda.service.ledger_store import SqliteLedgerStore, connect_read_only

    path = Path(state_dir) / "state.sqlite"
    if not path.is_file():
        raise ConfigError(f"{state_dir}: no dpda state here (state.sqlite missing)")
    try:
        conn = connect_read_only(path)
    except sqlite3.Error as exc:
        raise ConfigError(f"{path}: cannot be read: {exc}") from None
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


def role_keys(state_dir: str) -> RoleKeys:
    """Keys by role. A missing or unreadable ``keys.json`` is a verification failure, never a
    reason to skip the signature checks."""
    from cryptography.hazmat.primitives import serialization

    f = Path(state_dir) / "keys.json"
    if not f.is_file():
        raise LedgerCorrupt(f"{f}: missing, so no signature can be checked")
    try:
        data = json.loads(f.read_text())
        side = data["side"]
        own = serialization.load_pem_public_key(data["self"].encode())
        peers = {n: serialization.load_pem_public_key(p.encode()) for n, p in data["peers"].items()}
    except (KeyError, ValueError, TypeError, AttributeError):
        raise LedgerCorrupt(f"{f}: unreadable, so no signature can be checked") from None
    if side not in ("source", "target"):
        raise LedgerCorrupt(f"{f}: side must be source or target")
    return RoleKeys(side, own, peers)


def verify_ledger(state_dir: str) -> tuple[list[str], list[str], int]:
    """(problems, warnings, entries checked) for a daemon's state directory.

    Each signature is checked against its role's key only: the source's against the source's,
    the countersignature against that peer's: a key that passed for either role would let the
    source forge every countersignature."""
    from dpda.dp.accounting import ledger_epsilon
    from dpda.dp.events import canonical_json, event_from_json
    from dpda.dp.ledger import verify_chain
    from dpda.service import signing

    conn, store = open_state(state_dir)
    problems: list[str] = []
    warnings: list[str] = []
    try:
        keys: RoleKeys | None = role_keys(state_dir)
    except LedgerCorrupt as exc:
        problems.append(str(exc))
        keys = None
    n = 0
    payloads: dict[tuple[str, int], str] = {}
    has_payloads = conn.execute("SELECT name FROM sqlite_master WHERE name='payloads'").fetchone()
    if has_payloads:
        # a session's first release with the source's DP standardization: its statistics are
        # stored beside it and covered by its payload hash
        stats: dict[tuple[str, int], bytes] = {}
        if conn.execute(
            "SELECT name FROM sqlite_master WHERE name='payload_statistics'"
        ).fetchone():
            for ds, seq, v in conn.execute(
                "SELECT dataset, seq, statistics FROM payload_statistics"
            ):
                stats[(ds, seq)] = v
        for ds, seq, z, c in conn.execute("SELECT dataset, seq, z, counts FROM payloads"):
            payloads[(ds, seq)] = hashlib.sha256(z + c + stats.get((ds, seq), b"")).hexdigest()
    if conn.execute("SELECT name FROM sqlite_master WHERE name='reweight_answers'").fetchone():
        for ds, seq, out in conn.execute("SELECT dataset, seq, outputs FROM reweight_answers"):
            payloads[(ds, seq)] = hashlib.sha256(out).hexdigest()
    ledger = {ds: store.entries(ds) for ds in store.datasets()}
    problems += _check_head(state_dir, ledger, keys)
    problems += _unsigned_outside_flight(ledger)
    problems += _traffic_past_the_ledger(conn, ledger)
    if keys is not None and keys.side == "source":
        problems += _released_without_audit(conn, ledger)
    for ds, entries in ledger.items():
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
            # the target's own releases (its statistics, its PATE queries): no source signs them
            own = e.params.get("kind") in OWN_ROWS_KINDS
            if e.payload_sha256 and not e.source_sig and not own:
                warnings.append(f"{ds} entry {e.seq}: not yet signed by the source")
            for role, sig in (("source", e.source_sig), ("target", e.target_sig)):
                if not sig or keys is None:
                    continue
                key = keys.source_key(e.peer) if role == "source" else keys.target_key(e.peer)
                if key is None:
                    problems.append(f"{ds} entry {e.seq}: no {role} key for peer {e.peer!r}")
                elif not signing.verify(key, msg, sig):
                    problems.append(f"{ds} entry {e.seq}: bad {role} signature")
            if e.payload_sha256 and not e.target_sig and not own:
                warnings.append(f"{ds} entry {e.seq}: not countersigned by the target")
            stored = payloads.get((ds, e.seq))
            if stored is not None and stored != e.payload_sha256:
                problems.append(f"{ds} entry {e.seq}: stored payload does not match its hash")
    return problems, warnings, n


def _released_without_audit(conn: Any, ledger: dict[str, list[Any]]) -> list[str]:
    """The source's entries that were delivered (countersigned by their target) with no
    audit record of the message that carried them: a wiped or truncated audit log. Only the
    source can tell: a target may hold entries it restored from its source after losing its
    state, whose messages its own log never saw."""
    from dpda.service.audit import RELEASE_METHODS, AuditLog

    sent = {
        (r.dataset, r.ledger_seq)
        for r, _ in AuditLog(conn, "").records()
        if r.direction == "out" and r.method.rsplit("/", 1)[-1] in RELEASE_METHODS
    }
    return [
        f"{ds} entry {e.seq}: delivered to its target, but no audit record carried it "
        "(the audit log was wiped or truncated)"
        for ds, entries in ledger.items()
        for e in entries
        if e.payload_sha256 and e.target_sig and (ds, e.seq) not in sent
    ]


# what a check of one state directory cannot see; printed with every standalone verify
STANDALONE_LIMITS = (
    "without --against PEER_STATE: entries past the last countersigned head, and a ledger "
    "rolled back together with its countersigned_head.json and the matching tail of the audit "
    "log and stored payloads (to an earlier, genuinely signed state), cannot be detected; only "
    "the peer's copy shows those"
)


def _check_head(state_dir: str, ledger: dict[str, list[Any]], keys: RoleKeys | None) -> list[str]:
    """The ledger against the last countersigned head this party keeps (``signed_head``); the
    head's own signatures are checked against the roles' keys."""
    from dpda.service import signed_head, signing

    path = Path(state_dir) / signed_head.FILE
    try:
        heads = signed_head.load(path)
    except (ValueError, TypeError):
        return [f"{path}: unreadable, so a truncated ledger cannot be detected"]
    if heads is None:
        signed = [ds for ds, es in ledger.items() if any(e.source_sig and e.target_sig for e in es)]
        if signed:
            return [
                f"{path}: missing, though {', '.join(signed)} holds countersigned entries; "
                "a truncated ledger cannot be detected"
            ]
        return []
    problems = signed_head.check(heads, ledger)
    for ds, entries in sorted(ledger.items()):
        both = [e.seq for e in entries if e.source_sig and e.target_sig]
        held = heads.get(ds)
        if both and (held is None or held.seq < both[-1]):
            # the head is written after every countersignature: one naming an earlier entry
            # (or none) was rewritten from the ledger's own entries, or lost
            named = "names no entry" if held is None else f"names entry {held.seq}"
            problems.append(
                f"{ds}: the countersigned head {named}, but entry {both[-1]} is countersigned: "
                "the head was rewritten or lost, so a cut tail cannot be ruled out"
            )
    for ds, head in sorted(heads.items()):
        if keys is None:
            continue
        msg = head.signed_message()
        source, target = keys.source_key(head.peer), keys.target_key(head.peer)
        if (
            source is None
            or target is None
            or not (
                signing.verify(source, msg, head.source_sig)
                and signing.verify(target, msg, head.target_sig)
            )
        ):
            problems.append(f"{ds}: the countersigned head's signatures do not verify")
    return problems


def _unsigned_outside_flight(ledger: dict[str, list[Any]]) -> list[str]:
    """Released entries (with a payload hash) that lack a signature, other than each peer's
    last of each dataset (the one in flight): the source signs before it sends and takes no new
    charge from a peer before the earlier releases are countersigned, so a gap elsewhere is a
    signature stripped from the file. An entry with neither signature nor payload hash is a
    charge whose release never left (a crash between the charge and its payload record): one
    such entry of a peer before its last can happen; more are signatures and hashes stripped
    (the entry hash does not cover them, so the chain still verifies)."""
    problems: list[str] = []
    for ds, entries in ledger.items():
        last: dict[str, int] = {}
        for e in entries:
            last[e.peer] = e.seq
        bare: dict[str, list[int]] = {}
        for e in entries:
            own = e.params.get("kind") in OWN_ROWS_KINDS
            if own or e.seq == last[e.peer]:
                continue
            if not e.payload_sha256:
                if not (e.source_sig or e.target_sig):
                    bare.setdefault(e.peer, []).append(e.seq)
                continue
            if not (e.source_sig and e.target_sig):
                problems.append(f"{ds} entry {e.seq}: released but missing a signature")
        for peer, seqs in sorted(bare.items()):
            if len(seqs) > 1:
                problems.append(
                    f"{ds} entries {', '.join(map(str, seqs))} of peer {peer[:24]}: neither "
                    "signed nor bound to a payload before the peer's last (signatures and "
                    "payload hashes stripped)"
                )
    return problems


def _traffic_past_the_ledger(conn: Any, ledger: dict[str, list[Any]]) -> list[str]:
    """What the rest of the state shows of releases the ledger no longer holds: an audit
    record of a release that names an entry past the ledger's end, payloads stored for such
    an entry, and, for an empty ledger, any audit record of a release or stored session (a
    ledger emptied with its head file: "0 entries" is not a clean state there)."""
    from dpda.service.audit import RELEASE_METHODS, AuditLog

    problems: list[str] = []
    length = {ds: len(es) for ds, es in ledger.items()}
    past: dict[str, int] = {}
    released = 0
    for r, _ in AuditLog(conn, "").records():
        if r.method.rsplit("/", 1)[-1] not in RELEASE_METHODS or r.direction == "refused":
            continue
        released += 1
        if r.dataset and r.ledger_seq >= length.get(r.dataset, 0):
            past[r.dataset] = max(past.get(r.dataset, -1), r.ledger_seq)
    for table in ("payloads", "reweight_answers"):
        if conn.execute("SELECT name FROM sqlite_master WHERE name=?", (table,)).fetchone():
            for ds, seq in conn.execute(f"SELECT dataset, MAX(seq) FROM {table} GROUP BY 1"):
                if seq is not None and seq >= length.get(ds, 0):
                    past[ds] = max(past.get(ds, -1), seq)
    for ds, seq in sorted(past.items()):
        problems.append(
            f"{ds}: the audit log or stored payloads show entry {seq} released, but the ledger "
            f"holds {length.get(ds, 0)} entries: entries were removed"
        )
    if not any(length.values()) and not past:
        sessions = 0
        if conn.execute("SELECT name FROM sqlite_master WHERE name='sessions'").fetchone():
            (sessions,) = conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
        if released or sessions:
            problems.append(
                f"the ledger is empty, but the audit log records {released} release messages "
                f"and {sessions} sessions are stored: the ledger was emptied"
            )
    return problems


OWN_ROWS_KINDS = ("target-disclosure", "target-row-queries")


def _own_rows_entry(e: Any) -> bool:
    """An entry the target keeps of its own rows' disclosures (charged by itself, for itself)."""
    return e.peer == "self" and e.params.get("kind") in OWN_ROWS_KINDS


def compare_with_peer(state_dir: str, peer_state_dir: str) -> list[str]:
    """Problems found comparing a ledger with the peer's copy of it. Each side keeps the head
    the other signed, so a tail lost on one side (with its audit records, or with a WAL) shows
    as a strict prefix of the other's copy."""
    _, mine = open_state(state_dir)
    _, theirs = open_state(peer_state_dir)
    problems: list[str] = []
    held = set(mine.datasets())
    for ds in sorted(set(theirs.datasets())):
        a, b = mine.entries(ds), theirs.entries(ds)
        if ds not in held and all(_own_rows_entry(e) for e in b):
            continue  # the peer's charges on its own rows: never shared, so never held here
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
