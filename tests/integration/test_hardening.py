"""Regressions against real daemons: bounded work per caller, admission before parsing,
session limits and expiry, role-bound terms signatures, countersign-before-next-release,
denials on record, and a lost source tail restored from the target's copy.

Each test names the 9ac3bc1 behaviour it guards against."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpda.dp.ledger import LedgerEntry, head_hash
from dpda.pb import dpda_pb2 as pb
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.service import serde, signing
from dpda.service.auth import Admission, AdmissionInterceptor, method_limits
from dpda.service.config import SourceLimits, load_source, load_target
from dpda.service.tls import channel_credentials, init_party
from dpda.source_party.app import run_server
from dpda.terms import SessionTerms

from .helpers import DELTA, SignedStub, synthetic_deployment

TIMEOUT = 20


def _terms(**kw: Any) -> str:
    base: dict[str, Any] = dict(
        dataset="synthetic", epsilon=1.0, delta=DELTA, projection="jl", projection_dim=5
    )
    base.update(kw)
    return SessionTerms(**base).model_dump_json()


class _Source:
    def __init__(self, dep: Any, rs: Any, stub: Any, channel: grpc.Channel) -> None:
        self.dep, self.rs, self.stub, self.channel = dep, rs, stub, channel

    def entries(self) -> list[LedgerEntry]:
        return self.rs.handlers.ledger.store.entries("synthetic")

    def open(self, **kw: Any) -> str:
        req = pb.OpenSessionRequest(terms_json=_terms(**kw))
        return str(self.stub.OpenSession(req, timeout=TIMEOUT).session_id)

    def release(self, sid: str, index: int = 0) -> pb.BatchRelease:
        head = head_hash(self.entries())
        req = pb.ReleaseBatchesRequest(session_id=sid, start=index, count=1, ledger_head=head)
        (msg,) = list(self.stub.ReleaseBatches(req, timeout=TIMEOUT))
        return msg

    def countersign(self, msg: Any) -> None:
        entry = LedgerEntry.from_json(msg.entry_json)
        sig = signing.sign(self.stub._key, entry.signed_message())
        req = pb.CountersignRequest(dataset=entry.dataset, seq=entry.seq, target_sig=sig)
        self.stub.Countersign(req, timeout=TIMEOUT)


def _start(tmp: Path, **limits: Any) -> Iterator[_Source]:
    dep = synthetic_deployment(tmp, attribute_unit=True)
    cfg = load_source(dep.source_config)
    cfg = cfg.model_copy(update={"limits": SourceLimits(**limits)})
    with run_server(cfg) as rs:
        k = dep.target_keys
        creds = channel_credentials(k.cert, k.key, k.ca)
        with grpc.secure_channel(f"127.0.0.1:{rs.port}", creds) as ch:
            yield _Source(dep, rs, SignedStub(pb_grpc.SourceServiceStub(ch), dep), ch)


@pytest.fixture
def source(tmp_path: Path) -> Iterator[_Source]:
    yield from _start(tmp_path)


def _unpinned(tmp: Path, src: _Source) -> grpc.Channel:
    """A certificate from the same CA that the source does not pin (anyone the CA signed)."""
    stranger = init_party(tmp / "stranger", "stranger-org", ca_dir=src.dep.workdir / "keys" / "ca")
    creds = channel_credentials(stranger.cert, stranger.key, src.dep.source_keys.ca)
    return grpc.secure_channel(f"127.0.0.1:{src.rs.port}", creds)


# ----------------------------------------------------------------- 1. planning outside the lock
def test_a_slow_plan_holds_no_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """9ac3bc1: a 10⁷-step calibration ran 153 s inside the handlers' lock and an honest release
    waited 122 s behind it. A plan made slow on purpose (a 3 s sleep around the real planner)
    must not delay another session's release."""
    import dpda.source_party.releases as releases

    real = releases.plan_batches

    def slow_plan(*args: Any, **kw: Any) -> Any:
        if threading.current_thread().name == "hostile-plan":
            time.sleep(3.0)
        return real(*args, **kw)

    gen = _start(tmp_path)
    src = next(gen)
    try:
        honest = src.open()
        monkeypatch.setattr(releases, "plan_batches", slow_plan)
        done: dict[str, float] = {}

        def hostile() -> None:
            # gRPC runs the handler on its own thread: name it from inside via the planner
            t0 = time.monotonic()
            src.open(epsilon=0.5)
            done["seconds"] = time.monotonic() - t0

        def mark(*args: Any, **kw: Any) -> Any:
            threading.current_thread().name = "hostile-plan"
            try:
                return slow_plan(*args, **kw)
            finally:
                threading.current_thread().name = "worker"

        monkeypatch.setattr(releases, "plan_batches", mark)
        th = threading.Thread(target=hostile)
        th.start()
        time.sleep(0.5)  # the hostile plan is sleeping now
        monkeypatch.setattr(releases, "plan_batches", real)
        t0 = time.monotonic()
        src.countersign(src.release(honest))
        honest_seconds = time.monotonic() - t0
        th.join(30)
        assert honest_seconds < 1.0, honest_seconds
        assert done["seconds"] >= 3.0  # the hostile plan really was slow
    finally:
        gen.close()


# σ calibrated for 10⁵ single-row minibatches: ~0.5 s of planning here (the 9ac3bc1 lock-up)
SLOW_PLAN: dict[str, Any] = dict(
    privacy_unit="attribute",
    release="rows",
    batch_size=1,
    noise_multiplier=0.0,
    steps=100_000,
    epsilon=8.0,
)


def test_a_plan_past_its_time_limit_is_refused_uncharged(tmp_path: Path) -> None:
    """Calibrating σ for 10⁵ single-row minibatches takes ~0.5 s here: past a 0.1 s limit it
    is refused with the reason, nothing charged, nothing stored."""
    gen = _start(tmp_path, plan_seconds=0.1)
    src = next(gen)
    try:
        with pytest.raises(grpc.RpcError) as e:
            src.open(**SLOW_PLAN)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert e.value.details().startswith("POLICY_REFUSED"), e.value.details()
        assert "longer than 0.1 s" in e.value.details()
        assert src.entries() == []
        (n,) = src.rs.handlers.conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
        assert n == 0
    finally:
        gen.close()


def _describe(src: _Source, planned: str = "") -> pb.DescribeDatasetResponse:
    req = pb.DescribeDatasetRequest(dataset="synthetic", planned_terms_json=planned)
    return src.stub.DescribeDataset(req, timeout=TIMEOUT)


def _warm_worker_idle(src: _Source) -> None:
    """Wait until the source's warm-up workers (sessions', planned terms') have run everything
    submitted before."""
    src.rs.handlers.workers.planner.submit(lambda: None).result(timeout=TIMEOUT)
    src.rs.handlers.workers.warmer.submit(lambda: None).result(timeout=TIMEOUT)


def test_planned_terms_are_composed_ahead_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``DescribeDataset`` with the terms the peer means to open (``planned_terms_json``, sent
    by the target while it computes its basis): the source plans them and composes their first
    charge in the background, so the session's release composes nothing more; nothing is
    charged, stored or prepared, and the facts are those of a plain describe."""
    from dpda.dp import accounting
    from dpda.dp.work_bounds import fresh_caches

    gen = _start(tmp_path)
    src = next(gen)
    try:
        releaser = src.rs.handlers.releasers["synthetic"]
        with fresh_caches() as own:  # this test's caches: no other work evicts from them
            assert _describe(src, _terms(epsilon=0.7321)) == _describe(src)
            _warm_worker_idle(src)
            assert own.epsilon.keys()  # the first charge, composed ahead
            assert src.entries() == [] and releaser._features == {} and releaser._sessions == {}
            (n,) = src.rs.handlers.conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
            assert n == 0
            made: list[Any] = []
            real = accounting._ledger_epsilon

            def counted(*args: Any) -> float:
                made.append(args)
                return real(*args)

            monkeypatch.setattr(accounting, "_ledger_epsilon", counted)
            sid = src.open(epsilon=0.7321)  # the JL basis is the source's: not the stand-in
            src.countersign(src.release(sid))
            _warm_worker_idle(src)
            assert made == []  # every cap of the charge was composed ahead
            assert len(src.entries()) == 1
    finally:
        gen.close()


def test_planned_terms_are_checked_and_bounded_like_a_plan(tmp_path: Path) -> None:
    """Malformed planned terms, or terms of another dataset, are refused naming the field, with
    nothing changed; terms whose plan outruns the time limit (the 9ac3bc1 lock-up) cost the
    caller nothing more than that limit on the planned terms' own worker: an honest session
    opened meanwhile still gets its warm-up (a shared worker dropped it, found by review), and
    a peer at its session limit gets no planning at all."""
    from dpda.dp.work_bounds import fresh_caches

    gen = _start(tmp_path, plan_seconds=0.2, sessions_per_peer=2)
    src = next(gen)
    try:
        for bad, says in (
            ("{", "TERMS_INVALID: the session terms are invalid: planned_terms_json:"),
            (_terms(dataset="another"), "planned_terms_json: its dataset is not the one"),
        ):
            with pytest.raises(grpc.RpcError) as e:
                _describe(src, bad)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert says in e.value.details(), e.value.details()
        t0 = time.monotonic()
        _describe(src, _terms(**SLOW_PLAN))
        assert time.monotonic() - t0 < 1.0  # answered at once; the plan runs in the background
        sid = src.open()
        assert sid in src.rs.handlers.workers.warming  # its warm-up was not dropped for the hint
        src.countersign(src.release(sid))
        _warm_worker_idle(src)
        assert time.monotonic() - t0 < 5.0  # the slow plan gave up at its limit
        assert len(src.entries()) == 1  # the honest release, and nothing else
        (n,) = src.rs.handlers.conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
        assert n == 1
        src.open()  # the peer's second session: at its limit of 2
        _warm_worker_idle(src)  # its own warm-up done before the snapshot
        with fresh_caches() as own:
            _describe(src)  # what a plain describe composes (the budget left)
            before = own.epsilon.keys()
            _describe(src, _terms(epsilon=0.6183))
            _warm_worker_idle(src)
            assert own.epsilon.keys() == before  # nothing planned for it
    finally:
        gen.close()


# ---------------------------------------------------------- 2/3. admission: role, size, threads
class _Ctx:
    """The two ServicerContext calls admission makes; no certificate (an unpinned caller)."""

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise RuntimeError(f"{code}: {details}")


def test_unauthorized_requests_are_never_parsed() -> None:
    """9ac3bc1 parsed four 250 MB OpenSession messages from an unpinned certificate before
    denying them (RSS 182 MB → 1.5 GB). Admission sees raw bytes and refuses first."""
    parsed: list[int] = []

    def parse(raw: bytes) -> Any:
        parsed.append(len(raw))
        return pb.OpenSessionRequest.FromString(raw)

    inner = grpc.unary_unary_rpc_method_handler(lambda req, ctx: req, parse, None)
    denied: list[Any] = []
    adm = Admission(
        {"sha256:" + "a" * 64},
        method_limits(40, serde.MAX_REQUEST_BYTES),
        peer_concurrency=4,
        anonymous_concurrency=1,
        peer_rate=100,
        anonymous_rate=100,
    )
    icp = AdmissionInterceptor(adm, denied.append)

    class Details:
        method = "/dpda.v1.SourceService/OpenSession"

    handler = icp.intercept_service(lambda d: inner, Details())
    assert handler.request_deserializer is None  # gRPC hands over raw bytes
    received: list[int] = []

    def wire() -> Iterator[bytes]:  # what gRPC receives when the handler asks for it
        received.append(1)
        yield b"\x12\x05hello" * 1000

    with pytest.raises(RuntimeError, match="PERMISSION_DENIED"):
        handler.stream_unary(wire(), _Ctx())
    assert parsed == [] and received == []
    assert [d.code for d in denied] == ["PERMISSION_DENIED"]


def test_an_unpinned_callers_message_is_refused_before_it_is_received(tmp_path: Path) -> None:
    """Unary methods were served as unary handlers: gRPC received each message whole before
    admission saw the caller (48 concurrent 31 MiB messages from an unpinned certificate raised
    the source's peak memory by 972 MB). Every method is now a request stream that admission
    reads from only after the caller's role, rate and concurrency pass; a pinned caller's
    message is received once, size-checked and parsed."""
    from dpda.service.tls import fingerprint

    pinned = init_party(tmp_path / "keys", "target-org").cert.read_bytes()
    fp = fingerprint(pinned)
    inner = grpc.unary_unary_rpc_method_handler(
        lambda req, ctx: req, pb.GetLedgerRequest.FromString
    )
    adm = Admission(
        {fp},
        method_limits(40, serde.MAX_REQUEST_BYTES),
        peer_concurrency=4,
        anonymous_concurrency=1,
        peer_rate=100,
        anonymous_rate=100,
    )
    icp = AdmissionInterceptor(adm, lambda d: None)

    class Details:
        method = "/dpda.v1.SourceService/GetLedger"

    handler = icp.intercept_service(lambda d: inner, Details())
    assert handler.request_streaming and not handler.response_streaming
    pulled: list[int] = []

    def wire(msg: bytes) -> Iterator[bytes]:
        pulled.append(len(msg))
        yield msg

    with pytest.raises(RuntimeError, match="PERMISSION_DENIED"):
        handler.stream_unary(wire(b"x" * (31 * 2**20)), _Ctx())
    assert pulled == []  # never received
    msg = pb.GetLedgerRequest(dataset="synthetic").SerializeToString()
    answer = handler.stream_unary(wire(msg), _PinnedCtx(pinned))
    assert answer.dataset == "synthetic" and pulled == [len(msg)]
    with pytest.raises(RuntimeError, match="INVALID_ARGUMENT"):  # too big, once received
        handler.stream_unary(wire(b"x" * 70_000), _PinnedCtx(pinned))
    assert adm._inflight == {fp: 0}  # every slot released


class _PinnedCtx(_Ctx):
    """A caller that presented ``cert_pem``."""

    def __init__(self, cert_pem: bytes) -> None:
        self.cert_pem = cert_pem

    def auth_context(self) -> dict[str, list[bytes]]:
        return {"x509_pem_cert": [self.cert_pem]}


def test_per_method_size_limits_follow_the_real_shapes(source: _Source) -> None:
    """A pinned peer's OpenSession larger than a k × k basis is refused before parsing."""
    k = 40
    limit = method_limits(k, serde.MAX_REQUEST_BYTES)["/dpda.v1.SourceService/OpenSession"]
    big = pb.OpenSessionRequest(terms_json=_terms(), basis=serde.to_pb(np.zeros((k, 2 * k * 40))))
    assert big.ByteSize() > limit
    before = source.entries()
    with pytest.raises(grpc.RpcError) as e:
        source.stub.OpenSession(big, timeout=TIMEOUT)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert e.value.details() == "INVALID_ARGUMENT: the request is malformed or out of bounds"
    small = pb.GetLedgerRequest(dataset="x" * 70_000)
    with pytest.raises(grpc.RpcError) as e:
        source.stub.GetLedger(small, timeout=TIMEOUT)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert source.entries() == before
    # refused at admission, before parsing (not by the handler's own shape checks)
    refused = [r for r, _ in source.rs.audit.records() if r.direction == "refused"]
    assert [r.method.rsplit("/", 1)[-1] for r in refused] == ["OpenSession", "GetLedger"]
    assert {r.request_id for r in refused} == {"INVALID_ARGUMENT"}


def test_unpinned_callers_cannot_starve_the_peer(tmp_path: Path, source: _Source) -> None:
    """9ac3bc1: eight anonymous Watch streams took all 8 workers; the pinned peer's GetLedger
    timed out after 15 s. Now Watch is for pinned peers, unpinned callers share one slot and a
    small rate, and every refusal is counted, logged and audited."""
    with _unpinned(tmp_path, source) as ch:
        health = health_pb2_grpc.HealthStub(ch)
        watches = [
            health.Watch(health_pb2.HealthCheckRequest(service=""), timeout=30) for _ in range(8)
        ]
        for w in watches:
            with pytest.raises(grpc.RpcError) as e:
                next(w)
            assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        codes: list[grpc.StatusCode] = []

        def flood() -> None:
            for _ in range(30):
                try:
                    health.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as exc:
                    codes.append(exc.code())

        threads = [threading.Thread(target=flood) for _ in range(8)]
        for th in threads:
            th.start()
        t0 = time.monotonic()
        for _ in range(20):
            source.stub.GetLedger(pb.GetLedgerRequest(dataset="synthetic"), timeout=TIMEOUT)
        pinned_seconds = time.monotonic() - t0
        for th in threads:
            th.join()
    assert pinned_seconds < 5, pinned_seconds
    assert grpc.StatusCode.UNAVAILABLE in codes  # the anonymous rate/concurrency limit held
    assert codes.count(grpc.StatusCode.OK) <= 20  # 5/s with a burst of 10, over a few seconds
    metrics = source.rs.metrics.registry
    denied = metrics.get_sample_value("dpda_refusals_total", {"code": "PERMISSION_DENIED"})
    overloaded = metrics.get_sample_value("dpda_refusals_total", {"code": "OVERLOADED"})
    assert denied == 8 and overloaded and overloaded > 0
    refused = [r for r, _ in source.rs.audit.records() if r.direction == "refused"]
    assert refused and all(r.peer.startswith("sha256:") for r in refused)
    unaudited = metrics.get_sample_value("dpda_refusals_unaudited_total", {"code": "OVERLOADED"})
    assert len(refused) + (unaudited or 0) >= denied + overloaded - 8  # the rest counted


# ------------------------------------------------------------- 4. sessions: limit, lazy, expiry
def test_sessions_are_limited_per_peer_prepared_lazily_and_expire(tmp_path: Path) -> None:
    """9ac3bc1: 2,000 sessions each kept a copy of the prepared dataset (RSS 182 → 585 MB),
    with no ledger entry and no limit."""
    gen = _start(tmp_path, sessions_per_peer=3, session_idle_s=1.5)
    src = next(gen)
    try:
        releaser = src.rs.handlers.releasers["synthetic"]
        sids = [src.open() for _ in range(3)]
        assert releaser._features == {}  # nothing prepared until a release needs it
        with pytest.raises(grpc.RpcError) as e:
            src.open()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "3 open sessions" in e.value.details()
        src.stub.CloseSession(pb.CloseSessionRequest(session_id=sids[0]), timeout=TIMEOUT)
        sids[0] = src.open()
        for sid in sids:
            src.countersign(src.release(sid))
        assert len(releaser._features) == 1  # one shared copy for the three sessions
        time.sleep(2.0)
        fresh = src.open()  # the idle three expired and freed their places
        assert {fresh} == {s for s in releaser._sessions}
        with pytest.raises(grpc.RpcError) as e:
            src.release(sids[1], 0)
        assert e.value.details() == "INVALID_ARGUMENT: the request is malformed or out of bounds"
    finally:
        gen.close()


# ------------------------------------------------------------------- 12. signed terms, countersign
def test_terms_must_carry_the_peers_signature(source: _Source) -> None:
    """9ac3bc1 never checked ``OpenSession.target_sig``."""
    other = signing.load_private(source.dep.source_keys.signing_key)  # not the target's key
    for sig in ("", "A" * 86 + "==", signing.sign(other, _terms().encode())):
        req = pb.OpenSessionRequest(terms_json=_terms(), target_sig=sig)
        req_bytes = req.SerializeToString()
        with pytest.raises(grpc.RpcError) as e:
            source.stub._stub.OpenSession(pb.OpenSessionRequest.FromString(req_bytes), timeout=9)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert e.value.details().startswith("PEER_MISBEHAVED")
    (n,) = source.rs.handlers.conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
    assert n == 0


def test_no_new_release_before_the_last_is_countersigned(source: _Source) -> None:
    """9ac3bc1 released the next batch whether or not the target had countersigned."""
    sid = source.open(
        privacy_unit="attribute", batch_size=50, noise_multiplier=1.0, steps=3, epsilon=4.0
    )
    first = source.release(sid, 0)
    with pytest.raises(grpc.RpcError) as e:
        source.release(sid, 1)
    assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert len(source.entries()) == 1
    again = source.release(sid, 0)  # a retry of the same request is no new charge
    assert again.entry_json == first.entry_json
    resp = source.stub.GetLedger(pb.GetLedgerRequest(dataset="synthetic"), timeout=TIMEOUT)
    assert list(resp.uncountersigned) == [0] and resp.length == 1
    source.countersign(first)
    source.countersign(source.release(sid, 1))
    assert len(source.entries()) == 2


# ----------------------------------------------------------- 6. a lost source tail is restored
def test_a_lost_source_tail_is_restored_from_the_targets_copy(tmp_path: Path) -> None:
    """9ac3bc1: truncating the WAL after a SIGKILL lost 3 committed releases and nothing noticed.
    Now the target sees the shorter ledger on its next contact and sends back its copy, signed
    by the source and countersigned by itself; the source never draws a restored release
    again, and both ledgers end equal."""
    from dpda.target_party.app import open_state
    from dpda.target_party.client import GrpcReleaseSource

    dep = synthetic_deployment(tmp_path, attribute_unit=True)
    db = dep.workdir / "source" / "state.sqlite"
    tcfg = load_target(dep.target_config)
    terms = SessionTerms(
        dataset="synthetic",
        epsilon=4.0,
        delta=DELTA,
        projection="jl",
        projection_dim=5,
        privacy_unit="attribute",
        release="rows",
        batch_size=50,
        noise_multiplier=1.0,
        steps=5,
    )
    from dpda.protocol import TargetDisclosure

    with run_server(load_source(dep.source_config)) as rs:
        tcfg = tcfg.model_copy(update={"source_address": f"127.0.0.1:{rs.port}"})
        ledger, audit = open_state(tcfg)
        client = GrpcReleaseSource(tcfg, ledger, audit)
        info = client.open_session(terms, TargetDisclosure())
        for i in range(4):
            client.release(info.session_id, i)
        client.close()
    # the source loses its last three entries and their payloads (as a lost WAL would)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM ledger WHERE seq >= 1")
        conn.execute("DELETE FROM payloads WHERE seq >= 1")
    with run_server(load_source(dep.source_config)) as rs:
        tcfg = tcfg.model_copy(update={"source_address": f"127.0.0.1:{rs.port}"})
        ledger, audit = open_state(tcfg)
        client = GrpcReleaseSource(tcfg, ledger, audit)
        client.sync_ledger()
        source_entries = rs.handlers.ledger.store.entries("synthetic")
        assert [e.to_json() for e in source_entries] == [
            e.to_json() for e in ledger.store.entries("synthetic")
        ]
        assert len(source_entries) == 4
        info = client.open_session(terms, TargetDisclosure())
        client.release(info.session_id, 4)  # the session goes on; the restored ones are not
        assert len(rs.handlers.ledger.store.entries("synthetic")) == 5
        client.close()
        k = dep.target_keys
        creds = channel_credentials(k.cert, k.key, k.ca)
        with grpc.secure_channel(f"127.0.0.1:{rs.port}", creds) as ch:
            stub = pb_grpc.SourceServiceStub(ch)
            head = head_hash(rs.handlers.ledger.store.entries("synthetic"))
            req = pb.ReleaseBatchesRequest(
                session_id=info.session_id, start=2, count=1, ledger_head=head
            )
            with pytest.raises(grpc.RpcError) as e:
                list(stub.ReleaseBatches(req, timeout=TIMEOUT))
            assert e.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert len(rs.handlers.ledger.store.entries("synthetic")) == 5
