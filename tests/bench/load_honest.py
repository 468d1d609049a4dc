"""The honest side of ``dpda bench load``: the deployment's dataset and caps, the workload
each honest session asks for, the target clients that run it (each the target's own
``GrpcReleaseSource``, its channel timed), and the recorder of their latencies and counts."""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpda.dp.mechanisms import PrivacyUnit

DATASET = "synthetic"
SOURCE_ROWS = 600
DELTA = 1.0 / (1.2 * SOURCE_ROWS)
DATASET_CAP = 100.0  # the largest dataset cap the source config accepts
PEER_CAP = 1e6
TARGET_BUDGET = 1e6
POLICY = {
    "units": ["record", "attribute"],
    "attribute_unit_exposes_labels_and_membership": True,
    "releases": ["rows", "prototypes", "class-gaussians"],
    "allow_pate": True,
}
OP_PATIENCE_S = 120.0  # an honest operation still refused after this long is an error
RPC_TIMEOUT_S = 60.0
BACKOFF_MAX_S = 0.2  # an honest client refused for a stale head waits at most this long


# ----------------------------------------------------------------------------- recording
@dataclass
class Recorder:
    """Thread-safe counters and latencies of the honest clients."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    rpc_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    rpc_refused: Counter = field(default_factory=Counter)  # (method, code) → n
    op_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    retries: Counter = field(default_factory=Counter)
    counts: Counter = field(default_factory=Counter)
    errors: list[str] = field(default_factory=list)
    timing: str = ""

    def rpc(self, method: str, ms: float, code: str | None) -> None:
        with self.lock:
            if code is None:
                self.rpc_ms[method].append(ms)
            else:
                self.rpc_refused[f"{method} {code}"] += 1
                if code == "UNAVAILABLE":  # OVERLOADED: the client backs off and retries
                    self.retries["overloaded"] += 1
                elif code == "FAILED_PRECONDITION":  # sync first: the client syncs, retries
                    self.retries["ledger_sync"] += 1

    def op(self, kind: str, ms: float) -> None:
        with self.lock:
            self.op_ms[kind].append(ms)

    def count(self, what: str, n: int = 1) -> None:
        with self.lock:
            self.counts[what] += n

    def retry(self, why: str) -> None:
        with self.lock:
            self.retries[why] += 1

    def error(self, where: str, exc: BaseException) -> None:
        with self.lock:
            self.errors.append(f"{where}: {type(exc).__name__}: {exc}")


def timing_interceptor(rec: Recorder) -> Any:
    """A client interceptor that times each RPC to its last response (innermost: no audit
    writes inside) and records the status code of the ones that fail."""
    import grpc

    class Timing(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
        def intercept_unary_unary(self, continuation, details, request):
            name = details.method.rsplit("/", 1)[-1]
            t0 = time.perf_counter()
            call = continuation(details, request)
            exc = call.exception()
            code = None if exc is None else exc.code().name
            rec.rpc(name, (time.perf_counter() - t0) * 1e3, code)
            return call

        def intercept_unary_stream(self, continuation, details, request):
            name = details.method.rsplit("/", 1)[-1]
            t0 = time.perf_counter()
            call = continuation(details, request)

            def gen():
                try:
                    yield from call
                except grpc.RpcError as exc:
                    rec.rpc(name, (time.perf_counter() - t0) * 1e3, exc.code().name)
                    raise
                rec.rpc(name, (time.perf_counter() - t0) * 1e3, None)

            return gen()

    return Timing()


@dataclass(frozen=True)
class Peer:
    name: str
    keys: Any  # common.tls.PartyKeys


@dataclass(frozen=True)
class Workload:
    """What each honest session asks for (identical terms: the ledger groups their events)."""

    steps: int = 4  # minibatch releases per session
    batch_size: int = 60  # of the source's 600 rows
    noise_multiplier: float = 20.0
    pate_calls: int = 2  # QueryTeachers calls per session
    pate_batch: int = 10  # queries per call
    pate_epsilon: float = 0.1
    pate_teachers: int = 10
    projection_dim: int = 10

    def terms(self) -> Any:
        from dpda.terms import SessionTerms

        return SessionTerms(
            dataset=DATASET,
            epsilon=1.0,
            delta=DELTA,
            privacy_unit=PrivacyUnit.ATTRIBUTE,
            release="rows",
            projection="target-pca",
            projection_dim=self.projection_dim,
            batch_size=self.batch_size,
            steps=self.steps,
            noise_multiplier=self.noise_multiplier,
            pate_epsilon=self.pate_epsilon,
            pate_queries=self.pate_calls * self.pate_batch,
            pate_teachers=self.pate_teachers,
        )


def target_view(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The target's public basis (its PCA, orthonormal columns) and its projected rows."""
    from dpda.data.synthetic import two_domains

    x = two_domains(SOURCE_ROWS, 500)[1].x
    xc = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    basis = np.ascontiguousarray(vt[:dim].T)
    return basis, x @ basis


def honest_client(workdir: Path, i: int, peer: Peer, dep: Any, address: str, rec: Recorder) -> Any:
    """A ``GrpcReleaseSource`` with its own state directory, whose channel is timed."""
    import grpc

    from dpda.pb import dpda_pb2_grpc as pb_grpc
    from dpda.service.audit import ClientAuditInterceptor
    from dpda.service.config import TargetConfig
    from dpda.target_party.app import open_state
    from dpda.target_party.client import GrpcReleaseSource

    cfg = TargetConfig.model_validate(
        {
            "state_dir": workdir / f"client-{i}",
            "source_address": address,
            "source_fingerprint": dep.source_keys.fingerprint,
            "source_signing_public_key": dep.source_keys.signing_pub,
            "tls": {"cert": peer.keys.cert, "key": peer.keys.key, "peer_ca": peer.keys.ca},
            "signing_key": peer.keys.signing_key,
            "budget_epsilon": TARGET_BUDGET,
            "job": {"dataset": DATASET, "data_kind": "synthetic", "epsilon": 1.0, "delta": DELTA},
            "timeout_s": RPC_TIMEOUT_S,
            "reconnect_s": OP_PATIENCE_S,
            "admin": {"enabled": False},
        }
    )
    ledger, audit = open_state(cfg)
    src = GrpcReleaseSource(cfg, ledger, audit)
    # time each RPC attempt below the client's retry loop; on the raw channel (below the audit
    # log's SQLite appends) where the client exposes it
    timing = timing_interceptor(rec)
    raw = getattr(src, "_raw_channel", None)
    if raw is not None:
        audited = grpc.intercept_channel(
            grpc.intercept_channel(raw, timing),
            ClientAuditInterceptor(audit, cfg.source_fingerprint),
        )
        rec.timing = "channel, below the client's audit log"
    else:
        audited = grpc.intercept_channel(src.channel, timing)
        rec.timing = "channel, including the client's audit-log appends"
    src.stub.stub = pb_grpc.SourceServiceStub(audited)
    return src


def patiently(rec: Recorder, src: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Run one honest operation; while the source says the ledger must be synced first (the
    head moved, or a release of this peer awaits its countersignature: ``LedgerBehind``),
    sync and ask again. A verification failure (``LedgerCorrupt``) is never retried."""
    from dpda.errors import LedgerBehind

    t0 = time.monotonic()
    attempt = 0
    while True:
        try:
            return fn(*args)
        except LedgerBehind:
            if time.monotonic() - t0 > OP_PATIENCE_S:
                raise
            attempt += 1
            rec.retry("operation_retries")
            # a jitter that grows slowly and stays short: fewer contenders per head, without
            # starving the clients that have waited longest (as exponential backoff does)
            time.sleep(random.uniform(0.0, min(BACKOFF_MAX_S, 0.01 * attempt)))
            src.sync_ledger()


def honest_session(
    src: Any,
    work: Workload,
    terms: Any,
    basis: np.ndarray,
    queries: np.ndarray,
    rec: Recorder,
    deadline: float,
    rng: random.Random,
) -> None:
    """One honest session, as a target runs it: open (sync first), release the minibatches one
    by one, ``work.pate_calls`` batches of PATE queries, close. Stops early (and closes) once
    ``deadline`` has passed. Every release and answer is verified, appended to the client's
    ledger copy and countersigned by ``GrpcReleaseSource``; closing waits for the last
    countersignature. A failure is raised after a best-effort close."""
    from dpda.protocol import TargetDisclosure

    def timed(kind: str, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        out = patiently(rec, src, fn, *args)
        rec.op(kind, (time.perf_counter() - t0) * 1e3)
        return out

    src.job_file.unlink(missing_ok=True)  # always a new session, never a resumed one
    info = timed("open", src.open_session, terms, TargetDisclosure(None, basis))
    rec.count("sessions_opened")
    try:
        for index in range(info.plan.steps):
            if time.monotonic() > deadline:
                break
            timed("release", src.release, info.session_id, index)
            rec.count("releases")
        for index in range(work.pate_calls):
            if time.monotonic() > deadline:
                break
            start = rng.randrange(0, queries.shape[0] - work.pate_batch + 1)
            q = np.ascontiguousarray(queries[start : start + work.pate_batch])
            labels = timed("pate", src.query_teachers, info.session_id, index, q)
            rec.count("pate_calls")
            rec.count("pate_queries", int(labels.shape[0]))
    except BaseException:
        try:  # best effort: do not leave the session open at the source
            src.settle()
        except Exception:
            pass
        try:
            src.close_session(info.session_id)
            rec.count("sessions_closed")
        except Exception:
            pass
        raise
    timed("close", src.close_session, info.session_id)
    rec.count("sessions_closed")


def honest_worker(
    make_client: Callable[[], Any],
    work: Workload,
    basis: np.ndarray,
    queries: np.ndarray,
    rec: Recorder,
    deadline: float,
    seed: int,
) -> None:
    """One honest client: sessions back to back until ``deadline``. A failed session is
    recorded as an error and the client goes on with a new one."""
    rng = random.Random(seed)
    terms = work.terms()
    try:
        src = make_client()
    except Exception as exc:
        rec.error("client setup", exc)
        return
    try:
        while time.monotonic() < deadline:
            try:
                honest_session(src, work, terms, basis, queries, rec, deadline, rng)
            except Exception as exc:
                rec.error("session", exc)
                time.sleep(0.1)
    finally:
        try:
            src.close()
        except Exception as exc:
            rec.error("client close", exc)
