"""Property-based fuzzing of every ``SourceService`` RPC against a real source daemon.

One daemon per module (a real gRPC server with real mTLS on port 0 and a real SQLite state file),
one channel per peer. For every RPC the fuzzer (``fuzz_requests``, generated from the proto
descriptors) sends ``DPDA_FUZZ_N`` (default 1,000; the campaign: 10,000) malformed or hostile
requests as the pinned peer: random and edge values, wrong dtypes, shapes and sizes, non-finite
data, broken and hostile terms, bad signatures, forged ledger entries, undecodable bytes, calls
on sessions never opened or already closed, replays. The oracle, for every answer:

* the status is one of the catalogue (``common.errors.PUBLIC_CATALOG``): the details read
  ``"CODE: public text"`` and the gRPC status is the one ``source_party.servicer.STATUS`` (or the
  admission layer, ``common.auth``) maps that code to; INTERNAL, UNKNOWN, a deadline or a dropped
  connection is a failure;
* the ledger (and the sessions table) changes only by what the calls that succeeded explain: per
  batch of concurrent calls, every new or altered entry is one a successful release, PATE
  answer, countersignature or restore names — a refused call changes nothing;
* the daemon is still up at the end: a health check and an honest release pass.

An unpinned certificate from the same CA gets only PERMISSION_DENIED (or OVERLOADED from the
anonymous limits), and random call orders on fresh sessions (before open, after close, replays)
get only catalogued answers.

Knobs: ``DPDA_FUZZ_N`` (requests per RPC), ``DPDA_FUZZ_UNPINNED_N`` (default 2,000),
``DPDA_FUZZ_ORDERS`` (random call sequences, default 150), ``DPDA_FUZZ_SEED`` (default 12),
``DPDA_FUZZ_JSON`` (write the counts there). ``pytest -s`` prints the counts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import message_factory
from grpc_health.v1 import health_pb2

from dpda.dp.ledger import LedgerEntry, head_hash
from dpda.errors import PUBLIC_CATALOG
from dpda.pb import dpda_pb2 as pb
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.public_source_terms import ReweightingTerms
from dpda.service import serde, signing
from dpda.service.config import SourceLimits, load_source
from dpda.service.status import STATUS
from dpda.service.tls import channel_credentials, init_party
from dpda.source_party.app import run_server
from dpda.terms import SessionTerms

from .fuzz_requests import METHODS, SERVICE, Generator, Live
from .helpers import DELTA, SignedStub, synthetic_deployment

N = int(os.environ.get("DPDA_FUZZ_N", "1000"))
N_UNPINNED = int(os.environ.get("DPDA_FUZZ_UNPINNED_N", str(min(N, 2000))))
N_ORDERS = int(os.environ.get("DPDA_FUZZ_ORDERS", str(max(1, min(150, N // 60)))))
SEED = int(os.environ.get("DPDA_FUZZ_SEED", "12"))
THREADS = 6  # below the pinned peer's 8 concurrent requests: no OVERLOADED from our own flood
BATCH = 120  # requests between two ledger comparisons
TIMEOUT = 60.0
DS = "synthetic"

# what the admission layer answers on its own (common.auth.AdmissionInterceptor)
ADMISSION_STATUS = {
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "OVERLOADED": grpc.StatusCode.UNAVAILABLE,
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
}
# codes whose public text carries the refused field (built from terms and policy only), or
# the budget numbers (cap, spent, needed: public, as DescribeDataset gives them)
DETAILED = {"TERMS_INVALID", "POLICY_REFUSED", "BUDGET_EXCEEDED"}
# the only reasons other codes may carry: templates over public shapes and counts (the peer's own
# request, and the source's feature count that OpenSession returns anyway) — never a data value
PUBLIC_REASONS = [
    re.compile(p)
    for p in (
        r"INVALID_ARGUMENT: basis of shape \(\d+(, \d+)*\) for a source with \d+ features: "
        r"projection (has the wrong shape|has non-finite entries|columns are not orthonormal)",
        r"INVALID_ARGUMENT: basis: \d+ columns, projection_dim \d+",
        r"INVALID_ARGUMENT: projection_dim \d+ exceeds the source's \d+ features",
        r"INVALID_ARGUMENT: scaling: \d+ and \d+ columns, the source has \d+ features",
        r"INVALID_ARGUMENT: target-pca needs the target's basis",
        r"INVALID_ARGUMENT: planned_terms_json: its dataset is not the one described",
        r"INVALID_ARGUMENT: unknown dataset",  # the caller's own name for it, to a pinned peer
        r"LEDGER_CORRUPT: this (release|answer) was sent before and its stored copy is lost: .*",
        # the reverse shape's holder (source_party.reweighting): shapes, bounds and counts
        r"INVALID_ARGUMENT: rows: need 2 to \d+ rows",
        r"INVALID_ARGUMENT: rows: \d+ columns, need 1 to \d+",
        r"INVALID_ARGUMENT: (rows|labels|basis): shape \(\d+(, \d+)*,?\), expected "
        r"\(\d+(, \d+)*,?\)",
        r"INVALID_ARGUMENT: (rows|labels|basis): every entry must be finite",
        r"INVALID_ARGUMENT: rows: every row's norm must be ≤ 1000",
        r"INVALID_ARGUMENT: labels: (single-stage needs the public rows' labels|every \|label\| "
        r"must be ≤ 1e\+06|only single-stage reads labels, not noisy-(fw|md))",
        r"INVALID_ARGUMENT: scale: must lie in \[1e-06, 1e\+06\]",
        r"INVALID_ARGUMENT: steps -?\d+\.\.-?\d+: the session has \d+ steps",
        r"INVALID_ARGUMENT: start: the session has taken \d+ steps",
        r"LEDGER_CORRUPT: these steps were charged and their outputs are lost: .*",
    )
]

STATS: dict[str, dict[str, Any]] = {}


def _terms(**kw: Any) -> str:
    base: dict[str, Any] = dict(dataset=DS, epsilon=4.0, delta=DELTA, projection="jl")
    base.update(kw)
    return SessionTerms(**base).model_dump_json()


# the honest sessions the fuzzer aims at (kept open); ROWS also serves the call-order test
ROWS = dict(
    epsilon=8.0,
    projection_dim=5,
    privacy_unit="attribute",
    release="rows",
    batch_size=50,
    noise_multiplier=2.0,
    steps=20,
)
PATE = dict(projection_dim=5, pate_epsilon=2.0, pate_queries=400, pate_teachers=20)
AGGREGATE = dict(epsilon=2.0, projection_dim=6, release="class-gaussians")


# ------------------------------------------------------------------------------ the daemon
@dataclass
class Daemon:
    dep: Any
    rs: Any
    channel: grpc.Channel
    stub: SignedStub
    live: Live
    pool: ThreadPoolExecutor
    calls: dict[str, Any] = field(default_factory=dict)

    def entries(self) -> list[LedgerEntry]:
        return self.rs.handlers.ledger.store.entries(DS)

    def snapshot(self) -> tuple[list[str], int, tuple[int, int]]:
        """(the dataset's entries, every dataset's entry count, (sessions, closed sessions))."""
        conn = self.rs.handlers.conn
        with self.rs.handlers.lock:
            (total,) = conn.execute("SELECT COUNT(*) FROM ledger").fetchone()
            sessions = conn.execute("SELECT COUNT(*), SUM(closed) FROM sessions").fetchone()
            entries = [e.to_json() for e in self.entries()]
        return entries, total, (int(sessions[0]), int(sessions[1] or 0))

    def open(self, terms_json: str, session_id: str = "") -> pb.OpenSessionResponse:
        req = pb.OpenSessionRequest(terms_json=terms_json, session_id=session_id)
        return self.stub.OpenSession(req, timeout=TIMEOUT)

    def close(self, sid: str) -> None:
        self.stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=TIMEOUT)

    def countersign_pending(self) -> None:
        """What an honest target does when it syncs: countersign its releases still unsigned."""
        resp = self.stub.GetLedger(pb.GetLedgerRequest(dataset=DS), timeout=TIMEOUT)
        entries = self.entries()
        for seq in resp.uncountersigned:
            sig = signing.sign(self.stub._key, entries[seq].signed_message())
            req = pb.CountersignRequest(dataset=DS, seq=seq, target_sig=sig)
            self.stub.Countersign(req, timeout=TIMEOUT)

    def refresh(self) -> None:
        rw = self.rs.handlers.reweighting.get(self.live.honest.get("reweighting", ""))
        self.live.reweight_taken = rw.opt.t if rw is not None else 0
        entries = self.entries()
        self.live.entries = [e.to_json() for e in entries]
        head = head_hash(entries)
        if head != self.live.heads[0]:
            self.live.heads.insert(0, head)
            del self.live.heads[20:]

    def honest_release(self) -> None:
        """An honest release of the next batch of the rows session, countersigned."""
        self.countersign_pending()
        sid = self.live.honest["rows"]
        done = {e.request_id for e in self.entries()}
        index = next(
            (i for i in range(self.live.steps[sid]) if f"{sid}/{i}" not in done),
            self.live.steps[sid] - 1,
        )
        head = head_hash(self.entries())
        req = pb.ReleaseBatchesRequest(session_id=sid, start=index, count=1, ledger_head=head)
        (msg,) = list(self.stub.ReleaseBatches(req, timeout=TIMEOUT))
        self.countersign_pending()
        assert msg.index == index

    def assert_alive(self) -> None:
        health = self.channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        resp = health(health_pb2.HealthCheckRequest(service=SERVICE.full_name), timeout=TIMEOUT)
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        self.stub.GetLedger(pb.GetLedgerRequest(dataset=DS), timeout=TIMEOUT)
        self.stub.GetProjection(
            pb.GetProjectionRequest(session_id=self.live.honest["aggregate"]), timeout=TIMEOUT
        )


def _state_root(factory: pytest.TempPathFactory) -> tuple[Path, bool]:
    """The deployment's directory: on tmpfs where there is one. The state file is a real SQLite
    file with its real settings (WAL, synchronous=FULL); on tmpfs its fsyncs cost nothing, so
    the fuzzer measures the handlers rather than the disk."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        return Path(tempfile.mkdtemp(prefix="dpda-fuzz-", dir=shm)), True
    return factory.mktemp("fuzz"), False


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    root, remove = _state_root(tmp_path_factory)
    try:
        dep = synthetic_deployment(root, attribute_unit=True, reweighting=True)
        cfg = load_source(dep.source_config)
        # The pinned peer's rate limit (500 requests/s) is raised so that the fuzzer measures
        # the handlers, not the token bucket: at the default most of the flood would come back
        # OVERLOADED. Its concurrency (8) and every anonymous limit keep their defaults.
        cfg = cfg.model_copy(update={"limits": SourceLimits(peer_rate=1e6, peer_concurrency=8)})
        with run_server(cfg) as rs:
            k = dep.target_keys
            creds = channel_credentials(k.cert, k.key, k.ca)
            options = [("grpc.max_send_message_length", -1)]
            with grpc.secure_channel(f"127.0.0.1:{rs.port}", creds, options) as ch:
                stub = SignedStub(pb_grpc.SourceServiceStub(ch), dep)
                live = Live(
                    dataset=DS,
                    delta=DELTA,
                    k=rs.handlers.releasers[DS].domain.x.shape[1],
                    peer_name=cfg.peers[0].name,
                    target_key=stub._key,
                    other_key=signing.load_private(dep.source_keys.signing_key),
                )
                with ThreadPoolExecutor(THREADS) as pool:
                    d = Daemon(dep, rs, ch, stub, live, pool)
                    for role, kw in (("rows", ROWS), ("pate", PATE), ("aggregate", AGGREGATE)):
                        terms = _terms(**kw)
                        resp = d.open(terms)
                        sid = resp.session_id
                        live.honest[role] = sid
                        live.terms[sid] = terms
                        live.ell[sid] = int(json.loads(terms)["projection_dim"])
                        live.steps[sid] = int(json.loads(resp.plan_json)["steps"])
                    # the reverse shape: an honest reweighting session on the same rows
                    rw_terms = ReweightingTerms(
                        dataset=DS, epsilon=1.0, delta=DELTA, steps=100_000
                    ).model_dump_json()
                    rows = np.random.default_rng(0).normal(size=(20, 3))
                    rw = stub.OpenReweighting(
                        pb.OpenReweightingRequest(
                            terms_json=rw_terms,
                            rows=serde.to_pb(rows),
                            scaling_mean=serde.to_pb(np.zeros(live.k)),
                            scaling_std=serde.to_pb(np.ones(live.k)),
                            basis=serde.to_pb(np.eye(live.k)[:, :3]),
                            scale=1.0,
                            target_sig=signing.sign(stub._key, rw_terms.encode()),
                        ),
                        timeout=TIMEOUT,
                    )
                    live.honest["reweighting"] = rw.session_id
                    live.steps[rw.session_id] = 100_000
                    d.honest_release()  # the ledger has an entry, countersigned, from the start
                    d.refresh()
                    yield d
                    d.assert_alive()
                    d.honest_release()
    finally:
        _report()
        if remove:
            shutil.rmtree(root, ignore_errors=True)


def _report() -> None:
    if not STATS:
        return
    print("\nfuzz counts (sent, ok, answers by code):")
    for name, s in STATS.items():
        codes = ", ".join(f"{c} {n}" for c, n in sorted(s["codes"].items()))
        print(f"  {name:28s} sent {s['sent']:6d}  ok {s['ok']:6d}  {s['seconds']:6.1f} s  {codes}")
    out = os.environ.get("DPDA_FUZZ_JSON")
    if out:
        Path(out).write_text(json.dumps(STATS, indent=2, sort_keys=True))


# ------------------------------------------------------------------------------ the oracle
@dataclass
class Outcome:
    code: str  # "OK" or a catalogue code
    responses: list[bytes]
    failure: str | None = None


def _judge(err: grpc.RpcError, table: dict[str, grpc.StatusCode]) -> tuple[str, str | None]:
    """(catalogue code, failure or None) of an error answer."""
    status, details = err.code(), err.details() or ""
    code = details.split(":", 1)[0]
    if status in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN):
        return code or status.name, f"{status.name}: {details!r}"
    if code not in PUBLIC_CATALOG or code == "INTERNAL":
        return status.name, f"not catalogued: {status.name} {details!r}"
    if table.get(code) != status:
        return code, f"{code} answered with status {status.name}"
    public = f"{code}: {PUBLIC_CATALOG[code]}"
    reason = details[len(public) + 2 :] if details.startswith(public + ": ") else None
    known = reason is not None and any(p.fullmatch(f"{code}: {reason}") for p in PUBLIC_REASONS)
    if details != public and not (code in DETAILED and reason is not None) and not known:
        return code, f"{code} with a text outside the catalogue: {details!r}"
    return code, None


def _call(
    channel: grpc.Channel, cache: dict[str, Any], method: str, data: bytes, table: dict
) -> Outcome:
    streaming = method.endswith("/ReleaseBatches")
    fn = cache.get(method)
    if fn is None:
        fn = cache[method] = (channel.unary_stream if streaming else channel.unary_unary)(method)
    got: list[bytes] = []
    try:
        if streaming:
            for msg in fn(data, timeout=TIMEOUT):
                got.append(msg)
        else:
            got.append(fn(data, timeout=TIMEOUT))
    except grpc.RpcError as err:
        code, failure = _judge(err, table)
        return Outcome(code, got, failure)
    return Outcome("OK", got)


def _explained(method: str, data: bytes, out: Outcome) -> tuple[set[int], int, int]:
    """What a call's answer accounts for: (ledger seqs it may have added or changed, sessions
    it opened, sessions it closed)."""
    seqs: set[int] = set()
    if method == "ReleaseBatches":  # every batch received, even before a refusal
        for raw in out.responses:
            seqs.add(int(json.loads(pb.BatchRelease.FromString(raw).entry_json)["seq"]))
    if out.code != "OK":
        return seqs, 0, 0
    if method == "QueryTeachers":
        entry_json = pb.QueryTeachersResponse.FromString(out.responses[0]).entry_json
        seqs.add(int(json.loads(entry_json)["seq"]))
    elif method == "Countersign":
        req = pb.CountersignRequest.FromString(data)
        if req.dataset == DS:
            seqs.add(req.seq)
    elif method == "RestoreLedger":
        for text in pb.RestoreLedgerRequest.FromString(data).entries_json:
            seqs.add(int(json.loads(text)["seq"]))
    elif method == "ReweightSteps":
        entry_json = pb.ReweightStepsResponse.FromString(out.responses[0]).entry_json
        seqs.add(int(json.loads(entry_json)["seq"]))
    elif method == "OpenSession":
        return seqs, 1, 0  # at most one session (a resumed one adds none)
    elif method == "CloseSession":
        return seqs, 0, 1
    return seqs, 0, 0


def _show(method: str, data: bytes) -> str:
    """A failing request, to reproduce it: its fields (when it parses) and its bytes."""
    try:
        cls = message_factory.GetMessageClass(METHODS[method].input_type)
        text = str(cls.FromString(data))
        text = " ".join(text.split())[:400]
    except Exception:
        text = "(undecodable)"
    return f"{text} | hex {data[:200].hex()}{'…' if len(data) > 200 else ''}"


@dataclass
class Tally:
    name: str
    sent: int = 0
    ok: int = 0
    kinds: Counter = field(default_factory=Counter)
    codes: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    slowest: list[tuple[float, str]] = field(default_factory=list)  # the 3 slowest calls
    t0: float = field(default_factory=time.monotonic)

    def add(
        self, kind: str, out: Outcome, data: bytes, index: int, method: str | None = None
    ) -> None:
        self.sent += 1
        self.kinds[kind] += 1
        self.codes[out.code] += 1
        self.ok += out.code == "OK"
        if out.failure is not None:
            shown = _show(method or self.name, data)
            self.fail(f"#{index} ({kind}) {out.failure}; request {shown}")

    def is_slow(self, seconds: float) -> bool:
        return len(self.slowest) < 3 or seconds > self.slowest[-1][0]

    def timed(self, seconds: float, text: str) -> None:
        if self.is_slow(seconds):
            self.slowest = sorted([*self.slowest, (round(seconds, 3), text)], reverse=True)[:3]

    def fail(self, text: str) -> None:
        if len(self.failures) < 200:
            self.failures.append(text)

    def record(self) -> dict[str, Any]:
        s = {
            "sent": self.sent,
            "ok": self.ok,
            "codes": dict(self.codes),
            "kinds": dict(self.kinds),
            "failures": len(self.failures),
            "slowest_calls": self.slowest,
            "seconds": round(time.monotonic() - self.t0, 2),
        }
        STATS[self.name] = s
        print(f"\n{self.name}: {json.dumps(s)}")
        return s

    def check(self) -> None:
        self.record()
        assert not self.failures, (
            f"{self.name}: {len(self.failures)} failures (seed {SEED}):\n"
            + "\n".join(self.failures[:15])
        )


def _check_state(
    tally: Tally,
    before: tuple[list[str], int, tuple[int, int]],
    after: tuple[list[str], int, tuple[int, int]],
    seqs: set[int],
    opened: int,
    closed: int,
    batch: int,
) -> None:
    """Every change of the ledger and the sessions is one a successful call accounts for."""
    (old, old_total, (old_n, old_closed)), (new, new_total, (new_n, new_closed)) = before, after
    if len(new) < len(old):
        tally.fail(f"batch {batch}: the ledger lost entries ({len(old)} → {len(new)})")
    for seq, (a, b) in enumerate(zip(old, new, strict=False)):
        if a != b and seq not in seqs:
            tally.fail(f"batch {batch}: entry {seq} changed by refused calls: {a} → {b}")
    for seq in range(len(old), len(new)):
        if seq not in seqs:
            tally.fail(f"batch {batch}: entry {seq} appended by refused calls: {new[seq]}")
    if new_total - old_total != len(new) - len(old):
        tally.fail(f"batch {batch}: entries of another dataset appeared")
    if not (0 <= new_n - old_n <= opened):
        tally.fail(f"batch {batch}: sessions {old_n} → {new_n} with {opened} opened")
    if not (0 <= new_closed - old_closed <= closed):
        tally.fail(f"batch {batch}: closed sessions {old_closed} → {new_closed}, {closed} closed")


def _run(d: Daemon, method: str, n: int, seed: int) -> Tally:
    """Send ``n`` hostile requests for ``method``, ``BATCH`` at a time over ``THREADS``."""
    tally = Tally(method)
    gen = Generator(seed, d.live)
    path = f"/{SERVICE.full_name}/{method}"
    table = {**STATUS, **ADMISSION_STATUS}
    known = set(d.live.terms) | set(d.live.victims) | set(d.live.closed)
    sent = 0
    batch = 0
    while sent < n:
        if method == "CloseSession":
            while len(d.live.victims) < 3:  # sessions for the fuzzer to close
                sid = d.open(d.live.terms[d.live.honest["aggregate"]]).session_id
                d.live.victims.append(sid)
                known.add(sid)
        d.refresh()
        reqs = [gen.request(method) for _ in range(min(BATCH, n - sent))]
        before = d.snapshot()

        def one(req: tuple[bytes, str]) -> tuple[Outcome, float]:
            t0 = time.monotonic()
            out = _call(d.channel, d.calls, path, req[0], table)
            return out, time.monotonic() - t0

        results = list(d.pool.map(one, reqs))
        after = d.snapshot()
        seqs: set[int] = set()
        opened = closed = 0
        new_sessions: list[str] = []
        for i, ((data, kind), (out, seconds)) in enumerate(zip(reqs, results, strict=True)):
            tally.add(kind, out, data, sent + i)
            if tally.is_slow(seconds):
                tally.timed(seconds, f"{out.code} {_show(method, data)[:160]}")
            s, o, c = _explained(method, data, out)
            seqs |= s
            opened += o
            closed += c
            if method == "OpenSession" and out.code == "OK":
                sid = pb.OpenSessionResponse.FromString(out.responses[0]).session_id
                if sid not in known:
                    new_sessions.append(sid)
            if method == "CloseSession" and out.code == "OK":
                sid = pb.CloseSessionRequest.FromString(data).session_id
                if sid in d.live.victims:
                    d.live.victims.remove(sid)
                    d.live.closed.append(sid)
        _check_state(tally, before, after, seqs, opened, closed, batch)
        # the honest peer's housekeeping (not counted): close what the fuzzer opened, sign
        for sid in new_sessions:
            d.close(sid)
            d.live.closed.append(sid)
            known.add(sid)
        del d.live.closed[:-50]
        d.countersign_pending()
        sent += len(reqs)
        batch += 1
    d.assert_alive()
    return tally


# ------------------------------------------------------------------------------ the tests
@pytest.mark.slow
@pytest.mark.parametrize("method", list(METHODS))
def test_fuzz_rpc(daemon: Daemon, method: str) -> None:
    """``DPDA_FUZZ_N`` hostile requests for one RPC from the pinned peer: 0 crashes, every answer
    catalogued, no ledger or session change by a refused call, the daemon up at the end."""
    seed = SEED * 1000 + list(METHODS).index(method)
    tally = _run(daemon, method, N, seed)
    tally.check()
    assert tally.sent >= N


@pytest.mark.slow
def test_fuzz_unpinned_peer(daemon: Daemon, tmp_path: Path) -> None:
    """A certificate from the same CA that the source does not pin: every RPC is refused before
    its message is parsed (PERMISSION_DENIED), health checks are rate-limited (OVERLOADED), and
    nothing changes."""
    tally = Tally("unpinned")
    dep = daemon.dep
    stranger = init_party(tmp_path / "stranger", "stranger-org", ca_dir=dep.workdir / "keys" / "ca")
    creds = channel_credentials(stranger.cert, stranger.key, dep.source_keys.ca)
    gen = Generator(SEED * 1000 + 99, daemon.live)
    names = list(METHODS)
    before = daemon.snapshot()
    table = dict(ADMISSION_STATUS)
    del table["INVALID_ARGUMENT"]  # an unpinned caller is refused before its message is read
    with grpc.secure_channel(f"127.0.0.1:{daemon.rs.port}", creds) as ch:
        cache: dict[str, Any] = {}
        reqs: list[tuple[str, bytes, str]] = []
        check = health_pb2.HealthCheckRequest(service="").SerializeToString()
        for i in range(N_UNPINNED):
            if i % 50 == 0:
                reqs.append(("/grpc.health.v1.Health/Check", check, "health"))
            elif i % 50 == 1:
                reqs.append(("/grpc.health.v1.Health/Watch", check, "health"))
            else:
                name = names[i % len(names)]
                data, kind = gen.request(name)
                reqs.append((f"/{SERVICE.full_name}/{name}", data, kind))

        def one(req: tuple[str, bytes, str]) -> Outcome:
            path, data, _ = req
            if path.endswith("/Watch"):  # a stream: its first answer is the verdict
                try:
                    next(ch.unary_stream(path)(data, timeout=TIMEOUT))
                except grpc.RpcError as err:
                    code, failure = _judge(err, table)
                    return Outcome(code, [], failure)
                return Outcome("OK", [], "an unpinned caller got a Watch stream")
            out = _call(ch, cache, path, data, table)
            if out.code == "OK" and not path.endswith("/Check"):
                out.failure = f"an unpinned caller was answered on {path}"
            return out

        for i, (req, out) in enumerate(zip(reqs, daemon.pool.map(one, reqs), strict=True)):
            name = req[0].rsplit("/", 1)[-1]
            tally.add(name, out, req[1], i, name)
    after = daemon.snapshot()
    if before != after:
        tally.fail("an unpinned caller changed the ledger or the sessions")
    tally.kinds = Counter({k: v for k, v in tally.kinds.items()})
    daemon.assert_alive()
    tally.check()
    assert tally.codes["PERMISSION_DENIED"] >= N_UNPINNED * 0.9


@pytest.mark.slow
def test_fuzz_call_orderings(daemon: Daemon) -> None:
    """Random call sequences on fresh sessions: calls before OpenSession, after CloseSession,
    repeated closes, resumed sessions, replayed and out-of-order releases, stale heads. A call
    on a session that is closed or was never opened is INVALID_ARGUMENT with the public text;
    every other answer is catalogued; the ledger moves only by the releases that succeeded."""
    import random

    tally = Tally("call-orderings")
    r = random.Random(SEED * 1000 + 77)
    d = daemon
    table = {**STATUS, **ADMISSION_STATUS}
    cache: dict[str, Any] = {}
    # record unit, aggregates: one release a session, so the dataset's budget lasts the run
    terms = _terms(epsilon=0.3, projection_dim=4, release="prototypes")
    ops = ["release", "release", "replay", "stale", "project", "query", "close", "resume"]
    ops += ["countersign", "ledger", "restore", "early"]
    for seq_no in range(N_ORDERS):
        d.refresh()
        sid = ""
        is_open = False
        last_release: bytes | None = None
        for _ in range(r.randint(4, 12)):
            op = r.choice(ops) if sid else r.choice(["open", "open", "early", "project"])
            target = sid or uuid.uuid4().hex  # before OpenSession: an id never opened
            head = head_hash(d.entries())
            if op == "open":
                method, req = "OpenSession", pb.OpenSessionRequest(terms_json=terms)
                req.target_sig = signing.sign(d.live.target_key, terms.encode())
            elif op == "resume":
                method = "OpenSession"
                req = pb.OpenSessionRequest(terms_json=terms, session_id=target)
                req.target_sig = signing.sign(d.live.target_key, terms.encode())
            elif op in ("release", "stale", "early"):
                method = "ReleaseBatches"
                index = r.choice([0, 0, 1, -1])
                stale = r.choice(d.live.heads[1:] or [head]) if op == "stale" else head
                req = pb.ReleaseBatchesRequest(
                    session_id=target if op != "early" else uuid.uuid4().hex,
                    start=index,
                    count=1,
                    ledger_head=stale,
                )
            elif op == "replay":
                if last_release is None:
                    continue
                method, req = "ReleaseBatches", pb.ReleaseBatchesRequest.FromString(last_release)
            elif op == "project":
                method, req = "GetProjection", pb.GetProjectionRequest(session_id=target)
            elif op == "query":
                q = pb.NDArray(dtype="<f8", shape=[1, 4], data=b"\x00" * 32)
                req = pb.QueryTeachersRequest(session_id=target, index=0, queries=q)
                method, req.ledger_head = "QueryTeachers", head
            elif op == "close":
                method, req = "CloseSession", pb.CloseSessionRequest(session_id=target)
            elif op == "countersign":
                d.countersign_pending()
                continue
            elif op == "ledger":
                method, req = (
                    "GetLedger",
                    pb.GetLedgerRequest(dataset=DS, since_seq=r.randint(0, 9)),
                )
            else:
                method = "RestoreLedger"
                entries = [e.to_json() for e in d.entries()]
                req = pb.RestoreLedgerRequest(
                    dataset=DS, entries_json=r.sample(entries, min(2, len(entries)))
                )
            data = req.SerializeToString()
            if method == "ReleaseBatches" and op != "early":
                last_release = data
            before = d.snapshot()
            out = _call(d.channel, cache, f"/{SERVICE.full_name}/{method}", data, table)
            after = d.snapshot()
            seqs, o, c = _explained(method, data, out)
            _check_state(tally, before, after, seqs, o, c, seq_no)
            tally.add(op, out, data, seq_no, method)
            # on a session never opened or already closed: INVALID_ARGUMENT (its exact public
            # text is checked by _judge), whatever else the request carries
            dead = op == "early" or not is_open
            on_session = op not in ("open", "ledger", "restore")
            if on_session and dead and out.code != "INVALID_ARGUMENT":
                tally.fail(f"sequence {seq_no}: {op} on a dead session answered {out.code}")
            if op == "open" and out.code == "OK":
                if is_open:
                    d.close(sid)
                sid = pb.OpenSessionResponse.FromString(out.responses[0]).session_id
                is_open = True
            if op == "close" and out.code == "OK":
                is_open = False
        if is_open:
            d.close(sid)
        d.countersign_pending()
    tally.check()
    d.assert_alive()
