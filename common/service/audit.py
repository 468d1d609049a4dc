"""The payload audit log: every gRPC message both ways, hash-chained, optionally retained.

A record is built by a chain of small steps: *describe* (method, direction, peer, size) →
*digest* (SHA-256 of the serialized message; for a release, the payload hash and the ledger entry
it belongs to) → *chain* (``prev_hash``, ``record_hash``) → *store* (SQLite, same durable
settings as the ledger). ``verify`` re-walks the chain and checks that every source→target release
is covered by a ledger entry whose payload hash matches; ``report`` sums what left, by mechanism,
bytes and ε.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import grpc

from dpda.dp.events import canonical_json

GENESIS = "0" * 64

_SCHEMA = """
CREATE TABLE IF NOT EXISTS audit (
    seq INTEGER PRIMARY KEY,
    record_json TEXT NOT NULL,
    payload BLOB
);
"""


@dataclass(frozen=True)
class AuditRecord:
    seq: int
    prev_hash: str
    time: float
    side: str  # "source" | "target": whose log this is
    direction: str  # "in" | "out" (relative to this side)
    method: str
    peer: str  # peer certificate fingerprint (or pinned identity on the client side)
    request_id: str
    size: int
    sha256: str  # of the serialized message
    payload_sha256: str = ""  # for releases: the hash the ledger entry records
    dataset: str = ""
    ledger_seq: int = -1
    sig: str = ""  # Ed25519 by this side's signing key over ``record_hash`` (not part of it)

    def record_hash(self) -> str:
        body = asdict(self)
        body.pop("sig")
        return hashlib.sha256(canonical_json(body).encode()).hexdigest()


class AuditLog:
    """``key``: this side's Ed25519 signing key; every record appended is signed with it, so an
    edited or rewritten log does not verify without the key (the daemons always pass it)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        side: str,
        retain_payloads: bool = False,
        key: Any = None,
    ) -> None:
        self.conn = conn
        self.conn.executescript(_SCHEMA)
        self.side = side
        self.retain = retain_payloads
        self.key = key
        self.lock = threading.RLock()

    def records(self) -> list[tuple[AuditRecord, bytes | None]]:
        with self.lock:
            rows = self.conn.execute(
                "SELECT record_json, payload FROM audit ORDER BY seq"
            ).fetchall()
        return [(AuditRecord(**json.loads(r[0])), r[1]) for r in rows]

    def append(
        self,
        direction: str,
        method: str,
        peer: str,
        message: bytes,
        request_id: str = "",
        payload_sha256: str = "",
        dataset: str = "",
        ledger_seq: int = -1,
    ) -> AuditRecord:
        with self.lock:
            last = self.conn.execute(
                "SELECT seq, record_json FROM audit ORDER BY seq DESC LIMIT 1"
            ).fetchone()
            seq = 0 if last is None else last[0] + 1
            prev = GENESIS if last is None else AuditRecord(**json.loads(last[1])).record_hash()
            rec = AuditRecord(
                seq=seq,
                prev_hash=prev,
                time=time.time(),
                side=self.side,
                direction=direction,
                method=method,
                peer=peer,
                request_id=request_id,
                size=len(message),
                sha256=hashlib.sha256(message).hexdigest(),
                payload_sha256=payload_sha256,
                dataset=dataset,
                ledger_seq=ledger_seq,
            )
            if self.key is not None:
                from dpda.service import signing

                rec = replace(rec, sig=signing.sign(self.key, rec.record_hash().encode()))
            self.conn.execute(
                "INSERT INTO audit VALUES (?, ?, ?)",
                (seq, canonical_json(asdict(rec)), message if self.retain else None),
            )
        return rec


# the mechanism family per RPC (the ledger entry's spec says which release: rows or aggregates)
RELEASE_METHODS = {
    "ReleaseBatches": "gaussian-features+counts",
    "QueryTeachers": "pate-votes",
    "ReweightSteps": "reweighting-steps",
}


def _release_fields(msg: Any) -> dict[str, Any]:
    """Ledger linkage of a release message (BatchRelease, QueryTeachersResponse); else empty."""
    entry_json = getattr(msg, "entry_json", "")
    if not entry_json:
        return {}
    entry = json.loads(entry_json)
    return {
        "payload_sha256": msg.payload_sha256,
        "dataset": entry["dataset"],
        "ledger_seq": int(entry["seq"]),
        "request_id": entry.get("request_id", ""),
    }


def _request_id(msg: Any) -> str:
    return getattr(msg, "request_id", "") or getattr(msg, "session_id", "")


# ----------------------------------------------------------------------------- server side
class ServerAuditInterceptor(grpc.ServerInterceptor):
    """Records every request and response of the source's RPCs."""

    def __init__(
        self,
        log: AuditLog,
        peer_of: Callable[[grpc.ServicerContext], str],
        observe: Callable[[AuditRecord], None] | None = None,
        timed: Callable[[str, float], None] | None = None,
    ) -> None:
        self.log = log
        self.peer_of = peer_of
        self.observe = observe or (lambda rec: None)
        self.timed = timed or (lambda method, seconds: None)

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        if method.startswith("/grpc.health."):
            # health checks carry no data; recording each with an fsync let anyone holding a
            # CA certificate make the source write to disk at will (admission still counts them)
            return handler
        log, peer_of, observe, timed = self.log, self.peer_of, self.observe, self.timed
        if handler.unary_unary:
            inner = handler.unary_unary

            def unary(request, context):
                t0 = time.perf_counter()
                peer = peer_of(context)
                log.append("in", method, peer, request.SerializeToString(), _request_id(request))
                try:
                    response = inner(request, context)
                finally:
                    timed(method, time.perf_counter() - t0)
                fields = {"request_id": _request_id(request), **_release_fields(response)}
                observe(log.append("out", method, peer, response.SerializeToString(), **fields))
                return response

            return grpc.unary_unary_rpc_method_handler(
                unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream:
            inner_s = handler.unary_stream

            def stream(request, context):
                t0 = time.perf_counter()
                peer = peer_of(context)
                log.append("in", method, peer, request.SerializeToString(), _request_id(request))
                try:
                    for response in inner_s(request, context):
                        fields = {"request_id": _request_id(request), **_release_fields(response)}
                        msg = response.SerializeToString()
                        observe(log.append("out", method, peer, msg, **fields))
                        yield response
                finally:
                    timed(method, time.perf_counter() - t0)

            return grpc.unary_stream_rpc_method_handler(
                stream, handler.request_deserializer, handler.response_serializer
            )
        return handler


# ----------------------------------------------------------------------------- client side
class ClientAuditInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Records every request and response the target exchanges with the source."""

    def __init__(self, log: AuditLog, peer: str) -> None:
        self.log = log
        self.peer = peer

    def intercept_unary_unary(self, continuation, details, request):
        self.log.append(
            "out", details.method, self.peer, request.SerializeToString(), _request_id(request)
        )
        call = continuation(details, request)
        response = call.result()
        fields = {"request_id": _request_id(request), **_release_fields(response)}
        self.log.append("in", details.method, self.peer, response.SerializeToString(), **fields)
        return call

    def intercept_unary_stream(self, continuation, details, request):
        self.log.append(
            "out", details.method, self.peer, request.SerializeToString(), _request_id(request)
        )
        call = continuation(details, request)

        def gen() -> Iterator[Any]:
            for response in call:
                fields = {"request_id": _request_id(request), **_release_fields(response)}
                self.log.append(
                    "in", details.method, self.peer, response.SerializeToString(), **fields
                )
                yield response

        return gen()


# ------------------------------------------------------------------------- verify / report
def verify(
    log: AuditLog, ledger_entries: dict[tuple[str, int], Any], public_key: Any = None
) -> list[str]:
    """Problems found (empty when all is well): chain, signatures (with ``public_key``, this
    side's), message hashes, ledger coverage."""
    from dpda.service import signing

    problems: list[str] = []
    prev = GENESIS
    for i, (rec, payload) in enumerate(log.records()):
        if rec.seq != i:
            problems.append(f"audit record {i}: sequence out of order")
        if rec.prev_hash != prev:
            problems.append(f"audit record {rec.seq}: hash chain broken")
        prev = rec.record_hash()
        if public_key is not None and not signing.verify(public_key, prev.encode(), rec.sig):
            problems.append(f"audit record {rec.seq}: not signed by this side's key")
        if payload is not None and hashlib.sha256(payload).hexdigest() != rec.sha256:
            problems.append(f"audit record {rec.seq}: retained payload does not match its hash")
        released = rec.method.rsplit("/", 1)[-1] in RELEASE_METHODS and rec.ledger_seq >= 0
        if released and ((rec.side == "source") == (rec.direction == "out")):
            entry = ledger_entries.get((rec.dataset, rec.ledger_seq))
            if entry is None:
                problems.append(f"audit record {rec.seq}: release without a ledger entry")
            elif entry.payload_sha256 != rec.payload_sha256:
                problems.append(f"audit record {rec.seq}: payload hash differs from the ledger")
            batch = rec.method.endswith("/ReleaseBatches")
            if batch and payload is not None and hashlib.sha256(payload).hexdigest() == rec.sha256:
                from google.protobuf.message import DecodeError

                from dpda.pb import dpda_pb2 as pb

                try:
                    msg = pb.BatchRelease.FromString(payload)
                    digest = hashlib.sha256(msg.z.data + msg.noisy_counts.data).hexdigest()
                except DecodeError:
                    digest = ""
                if digest != rec.payload_sha256:
                    problems.append(f"audit record {rec.seq}: payload bytes differ from hash")
    return problems


def report(log: AuditLog, ledger_entries: dict[tuple[str, int], Any]) -> dict[str, Any]:
    """What left this organization: messages and bytes by method, releases and ε by dataset."""
    records = [r for r, _ in log.records()]
    side = records[0].side if records else ""
    outgoing = [r for r in records if r.direction == "out"]
    by_method: dict[str, dict[str, int]] = {}
    for r in outgoing:
        m = by_method.setdefault(r.method.rsplit("/", 1)[-1], {"messages": 0, "bytes": 0})
        m["messages"] += 1
        m["bytes"] += r.size
    releases: dict[str, dict[str, Any]] = {}
    for r in records:
        method = r.method.split("/")[-1]
        if r.ledger_seq < 0 or method not in RELEASE_METHODS:
            continue
        entry = ledger_entries.get((r.dataset, r.ledger_seq))
        mech = RELEASE_METHODS[method]
        spec = entry.params.get("spec") if entry is not None else None
        if isinstance(spec, dict) and spec.get("kind") == "metric":
            mech = "gaussian-metric-steps"  # the learned ground cost W
        d = releases.setdefault(
            f"{r.dataset}/{mech}",
            {"dataset": r.dataset, "releases": 0, "bytes": 0, "epsilon": 0.0, "mechanism": mech},
        )
        d["releases"] += 1
        d["bytes"] += r.size
        if entry is not None:
            d["epsilon"] = max(d["epsilon"], entry.spend_after)
    return {
        "side": side,
        "records": len(records),
        "outgoing_by_method": by_method,
        "releases_by_dataset": releases,
        "disclosures": disclosures(outgoing, ledger_entries) if side == "target" else [],
    }


# what each outgoing target message says about the target's own rows
_TARGET_DISCLOSES = {
    "OpenSession": "column scaling, projection basis, clipping norm",
    "QueryTeachers": "queried target rows (projected or raw), or points standing for them",
    "OpenReweighting": "this side's public rows and their map (public data)",
}


def disclosures(outgoing: list[AuditRecord], ledger_entries: dict[tuple[str, int], Any]) -> list:
    """Every message in which the target disclosed something about its rows, with the mechanism
    and ε: an ``OpenSession`` under the target's DP policy is joined to its own ledger entry
    (``own-rows``, by request id); without one it went out exact."""
    own = {
        e.request_id: e
        for e in ledger_entries.values()
        if e.params.get("kind") in ("target-disclosure", "target-row-queries")
    }
    # row queries are charged once per job, in the session that first sent them
    queried = {e.session: e for e in own.values() if e.params["kind"] == "target-row-queries"}
    out = []
    for r in outgoing:
        method = r.method.rsplit("/", 1)[-1]
        if method not in _TARGET_DISCLOSES:
            continue
        e = own.get(r.request_id)
        if method == "QueryTeachers":  # its request id is the session's
            e = queried.get(r.request_id)
        public = method == "OpenReweighting"
        out.append(
            {
                "time": r.time,
                "method": method,
                "what": e.params.get("what", _TARGET_DISCLOSES[method])
                if e
                else _TARGET_DISCLOSES[method],
                "mechanism": e.params["mechanism"] if e else ("public" if public else "exact"),
                "epsilon": e.params["epsilon"] if e else (0.0 if public else None),
                "delta": e.params["delta"] if e else None,
                "ledger": None if e is None else {"dataset": e.dataset, "seq": e.seq},
                "bytes": r.size,
            }
        )
    return out
