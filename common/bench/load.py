"""``dpda bench load``: concurrent honest target sessions and PATE queries against one source
daemon, with a hostile client flooding it in parallel (issue 12).

* **The source** is ``dpda source serve`` as a separate process (mTLS, SQLite ledger, audit log,
  its default limits), serving a synthetic dataset whose policy allows the attribute unit, row
  releases and PATE. The dataset cap is the largest the config accepts (ε = 100) and the peer
  and target caps are 1e6, with a per-release ε small enough that the honest sessions of a
  five-minute run stay far below them: this measures load, not budget exhaustion.
* **Honest clients** (``--sessions`` threads, spread over ``--peers`` pinned target
  organizations, by default one each) each run ``honest_session`` in a loop until the duration
  ends: open a session (signed terms, the target's PCA basis), release its minibatches one by
  one, ask the PATE teachers a few batches of queries, close. Each client is the target's own
  ``GrpcReleaseSource`` with its own ledger copy and audit log, so every release is verified,
  appended and countersigned as in ``dpda target run``. With many sessions on one dataset the
  ledger head moves between a client's sync and its request; the source then refuses
  (FAILED_PRECONDITION: sync first, or countersign first) and the client syncs and asks again:
  protocol behaviour, counted as ``retries``, not as errors. An OVERLOADED answer (UNAVAILABLE)
  is retried with backoff by the client and counted likewise. An **error** is an honest
  operation that ends in any other failure, or that is still refused after
  ``OP_PATIENCE_S`` seconds of retries.
* **The hostile client** runs in a process of its own with a certificate from the same CA that
  the source has not pinned: multi-MB ``OpenSession`` messages, health ``Watch`` streams,
  garbage bytes to every method, and a fresh TLS connection per request on one thread.
* **Measured**: the latency of every honest RPC that succeeded (at the channel, below the
  client's own audit log; refusals are counted, not timed) and of every honest operation (its
  RPCs plus the client's verification, syncs and retries); the source's peak RSS (``VmHWM``,
  with ``VmRSS`` sampled throughout); the refusals the source counted; CPU seconds per
  process; and, after the run, ``dpda ledger verify`` of the source's state.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import shutil
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dpda.dp.mechanisms import PrivacyUnit
from dpda.service.output import add_json_option, write_json

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
HOSTILE_BIG_BYTES = 4 * 1024 * 1024
PINNED_KINDS = ("hint ", "pate ")  # bench.hostile's patterns of a pinned peer
REQUIRED_KEYS = ("sessions", "errors", "p50_ms", "p99_ms", "peak_rss_mb", "hostile_requests")


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


def _timing_interceptor(rec: Recorder) -> Any:
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


def _percentiles(ms: list[float]) -> dict[str, float]:
    if not ms:
        return {"n": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
    a = np.asarray(ms)
    return {
        "n": int(a.size),
        "p50_ms": round(float(np.percentile(a, 50)), 3),
        "p99_ms": round(float(np.percentile(a, 99)), 3),
        "max_ms": round(float(a.max()), 3),
    }


# ---------------------------------------------------------------------------- deployment
@dataclass(frozen=True)
class Peer:
    name: str
    keys: Any  # common.tls.PartyKeys


def _deploy(workdir: Path, n_peers: int, extra: tuple[str, ...] = ()) -> tuple[Any, list[Peer]]:
    """The source's config (one synthetic dataset, ``n_peers`` pinned target organizations from
    one CA, then the pinned organizations named in ``extra``) and their keys."""
    from dpda.deployment import _table, make_deployment
    from dpda.service.tls import init_party

    dataset = {
        "name": DATASET,
        "kind": "synthetic",
        "synthetic_rows": [SOURCE_ROWS, 500],
        "epsilon": DATASET_CAP,
        "delta": DELTA,
        "policy": POLICY,
    }
    job = {"dataset": DATASET, "data_kind": "synthetic", "epsilon": 1.0, "delta": DELTA}
    dep = make_deployment(
        workdir,
        dataset=dataset,
        job=job,
        peer_cap=PEER_CAP,
        target_privacy={"disclosures": "exact"},
    )
    peers = [Peer("target-org", dep.target_keys)]
    tables = ""
    names = [f"target-org-{i}" for i in range(2, n_peers + 1)] + list(extra)
    for name in names:
        keys = init_party(workdir / "keys", name, ca_dir=workdir / "keys" / "ca")
        peers.append(Peer(name, keys))
        tables += _table(
            "peers",
            {
                "name": name,
                "cert_fingerprint": keys.fingerprint,
                "signing_public_key": keys.signing_pub,
                "epsilon_cap": PEER_CAP,
            },
            array=True,
        )
    if tables:  # make_deployment's last table is [[peers]]: more of them may follow
        with dep.source_config.open("a") as fh:
            fh.write(tables)
    return dep, peers


def _read_status_kb(pid: int, field_name: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid = pid
        self.every_s = every_s
        self.samples: list[int] = []  # kB
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            kb = _read_status_kb(self.pid, "VmRSS")
            if kb is not None:
                self.samples.append(kb)
            self.stop.wait(self.every_s)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _rusage_s(who: int) -> float:
    import resource

    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _source_refusals(state_dir: Path) -> dict[str, float]:
    """``dpda_refusals_total`` by code from the source's admin API (loopback)."""
    try:
        port = int((state_dir / "admin_port").read_text())
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
            text = r.read().decode()
    except (OSError, ValueError):
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("dpda_refusals_total{"):
            labels, value = line.rsplit(" ", 1)
            code = labels.split('code="', 1)[1].split('"', 1)[0]
            out[code] = out.get(code, 0.0) + float(value)
    return out


# ---------------------------------------------------------------------------- honest side
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


def _target_view(dim: int) -> tuple[np.ndarray, np.ndarray]:
    """The target's public basis (its PCA, orthonormal columns) and its projected rows."""
    from dpda.data.synthetic import two_domains

    x = two_domains(SOURCE_ROWS, 500)[1].x
    xc = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    basis = np.ascontiguousarray(vt[:dim].T)
    return basis, x @ basis


def _client(workdir: Path, i: int, peer: Peer, dep: Any, address: str, rec: Recorder) -> Any:
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
    timing = _timing_interceptor(rec)
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


def _patiently(rec: Recorder, src: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Run one honest operation; while the source says the ledger must be synced first (the
    head moved, or a release of this peer awaits its countersignature: both are
    FAILED_PRECONDITION, LEDGER_CORRUPT with one public message), sync and ask again."""
    from dpda.errors import LedgerCorrupt

    t0 = time.monotonic()
    attempt = 0
    while True:
        try:
            return fn(*args)
        except LedgerCorrupt as exc:
            if not str(exc).startswith("source refused: LEDGER_CORRUPT"):
                raise  # a local verification failure: never retried
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
        out = _patiently(rec, src, fn, *args)
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


def _honest_worker(
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


# --------------------------------------------------------------------------- hostile side
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"


def _hostile_main(
    address: str, cert: str, key: str, ca: str, until: float, out: str, nice: int = 0
) -> None:
    """The hostile client (run in its own process): an unpinned certificate from the source's
    own CA, flooding until ``until`` (``time.time()``); writes its counts to ``out``. ``nice``
    lowers its CPU priority: on one small machine the attacker's own CPU would otherwise be
    taken from the source and the honest clients, which a remote attacker's is not."""
    if nice:
        os.nice(nice)
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from dpda.pb import dpda_pb2 as pb
    from dpda.pb import dpda_pb2_grpc as pb_grpc
    from dpda.service.auth import POLICY as METHODS
    from dpda.service.tls import channel_credentials

    creds = channel_credentials(Path(cert), Path(key), Path(ca))
    opts = [("grpc.max_send_message_length", 64 * 1024 * 1024)]
    lock = threading.Lock()
    codes: Counter = Counter()  # "kind CODE" → n
    sent = {"bytes": 0}
    stop = threading.Event()

    def note(kind: str, code: str) -> None:
        with lock:
            codes[f"{kind} {code}"] += 1

    def call(kind: str, fn: Callable[..., object], size: int = 0) -> None:
        with lock:
            sent["bytes"] += size
        try:
            fn()
            note(kind, "OK")
        except grpc.RpcError as exc:
            note(kind, exc.code().name if hasattr(exc, "code") else "ERROR")
        except Exception as exc:
            note(kind, type(exc).__name__)

    def big_open() -> None:
        rng = np.random.default_rng(1)
        with grpc.secure_channel(address, creds, options=opts) as ch:
            stub = pb_grpc.SourceServiceStub(ch)
            while not stop.is_set():
                cols = HOSTILE_BIG_BYTES // (8 * 40)
                data = rng.bytes(8 * 40 * cols)
                req = pb.OpenSessionRequest(
                    request_id="x" * 32,
                    terms_json='{"dataset": "synthetic", "epsilon": 100}' + " " * 1024,
                    basis=pb.NDArray(dtype="<f8", shape=[40, cols], data=data),
                    target_sig="A" * 88,
                )
                call(
                    "big-open-session",
                    lambda r=req: stub.OpenSession(r, timeout=10),
                    req.ByteSize(),
                )

    def watch() -> None:
        with grpc.secure_channel(address, creds, options=opts) as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            while not stop.is_set():
                call(
                    "health-watch",
                    lambda: next(stub.Watch(health_pb2.HealthCheckRequest(), timeout=10)),
                )

    def garbage() -> None:
        rng = random.Random(2)
        methods = sorted(METHODS)
        with grpc.secure_channel(address, creds, options=opts) as ch:
            unary = {m: ch.unary_unary(m) for m in methods}
            stream = {m: ch.unary_stream(m) for m in methods}
            while not stop.is_set():
                m = rng.choice(methods)
                payload = rng.randbytes(rng.choice((1, 64, 4096, 60_000, 1_000_000)))
                kind = f"garbage {m.rsplit('/', 1)[-1]}"
                if m.endswith(("/ReleaseBatches", "/Watch")):
                    call(kind, lambda m=m, p=payload: list(stream[m](p, timeout=10)), len(payload))
                else:
                    call(kind, lambda m=m, p=payload: unary[m](p, timeout=10), len(payload))

    def reconnect() -> None:
        while not stop.is_set():  # a fresh TLS handshake for every request
            with grpc.secure_channel(address, creds, options=opts) as ch:
                check = ch.unary_unary(HEALTH_CHECK)  # a valid, empty HealthCheckRequest
                call("new-connection Check", lambda c=check: c(b"", timeout=10))

    threads = [
        threading.Thread(target=f, daemon=True)
        for f in (big_open, big_open, watch, garbage, garbage, reconnect)
    ]
    for t in threads:
        t.start()
    while time.time() < until:
        time.sleep(0.1)
    stop.set()
    for t in threads:
        t.join(timeout=15)
    Path(out).write_text(json.dumps({"codes": dict(codes), "bytes": sent["bytes"]}))


# ------------------------------------------------------------------------------- the run
def run_load(
    duration: float,
    sessions: int,
    peers: int = 0,
    workdir: Path | None = None,
    work: Workload | None = None,
    hostile: bool | tuple[str, ...] = True,
    hostile_nice: int = 10,
) -> dict[str, Any]:
    """The whole benchmark; returns the result dict (``REQUIRED_KEYS`` and more). ``hostile``:
    the patterns of ``bench.hostile`` to run beside the honest clients (True: the flood)."""
    from dpda.bench.hostile import UNPINNED

    patterns = ("flood",) if hostile is True else () if hostile is False else tuple(hostile)
    pinned_hostile = any(p not in UNPINNED for p in patterns)

    from dpda.deployment import SourceProcess
    from dpda.service.verify import verify_ledger

    work = work or Workload()
    n_peers = max(1, min(peers or sessions, sessions))
    keep = workdir is not None
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="dpda-load-"))
    root.mkdir(parents=True, exist_ok=True)
    dep, peer_keys = _deploy(root, n_peers, ("mallory-pinned",) if pinned_hostile else ())
    mallory_pinned = peer_keys.pop() if pinned_hostile else None
    basis, queries = _target_view(work.projection_dim)
    rec = Recorder()
    src = SourceProcess(dep)
    address = f"127.0.0.1:{src.port}"
    # the clients' own log lines (backoff notices) go to a file, not over the summary
    tlog = logging.getLogger("dpda.target")
    handler = logging.FileHandler(root / "clients.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    saved = tlog.propagate
    tlog.addHandler(handler)
    tlog.propagate = False
    sampler = RssSampler(src.proc.pid)
    sampler.start()
    hostile_out = root / "hostile.json"
    proc = None
    procs: list[Any] = []
    try:
        rss_start_kb = _read_status_kb(src.proc.pid, "VmRSS") or 0
        cpu0 = (_cpu_s(src.proc.pid), _rusage_s(0), _rusage_s(-1))  # source, self, children
        load0 = os.getloadavg()[0]
        t_start = time.monotonic()
        deadline = t_start + duration
        if "flood" in patterns:
            proc = _spawn_hostile(root, dep, address, duration, hostile_out, hostile_nice)
        for pattern in patterns:
            if pattern != "flood":
                procs.append(_spawn_pattern(pattern, root, dep, mallory_pinned, address, duration))
        workers = []
        for i in range(sessions):
            peer = peer_keys[i % n_peers]

            def make(i: int = i, peer: Peer = peer) -> Any:
                return _client(root, i, peer, dep, address, rec)

            t = threading.Thread(
                target=_honest_worker,
                args=(make, work, basis, queries, rec, deadline, 1000 + i),
                name=f"honest-{i}",
                daemon=True,
            )
            t.start()
            workers.append(t)
        for t in workers:
            t.join(timeout=max(0.0, deadline - time.monotonic()) + OP_PATIENCE_S + 60)
        stuck = sum(t.is_alive() for t in workers)
        wall = time.monotonic() - t_start
        for p in ([proc] if proc is not None else []) + procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
        peak_kb = _read_status_kb(src.proc.pid, "VmHWM") or 0
        cpu = {
            "source": round(_cpu_s(src.proc.pid) - cpu0[0], 1),
            "honest_clients": round(_rusage_s(0) - cpu0[1], 1),
            "hostile_client": round(_rusage_s(-1) - cpu0[2], 1),
            "cores": os.cpu_count(),
            "loadavg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],  # start, end
        }
        rss_end_kb = _read_status_kb(src.proc.pid, "VmRSS") or 0
        refusals = _source_refusals(dep.source_state)
    finally:
        sampler.stop.set()
        sampler.join(timeout=5)
        src.stop()
        for p in ([proc] if proc is not None else []) + procs:
            if p.is_alive():
                p.kill()
        tlog.removeHandler(handler)
        tlog.propagate = saved
        handler.close()
    problems, warnings, entries = verify_ledger(str(dep.source_state))
    last_spend = _last_spend(dep.source_state)
    flood = _merge_counts([hostile_out, *(root / f"hostile-{p}.json" for p in patterns)])
    out = _result(
        rec,
        sampler,
        flood,
        duration=duration,
        sessions=sessions,
        peers=n_peers,
        wall=wall,
        stuck=stuck,
        peak_kb=peak_kb,
        rss_kb=(rss_start_kb, rss_end_kb),
        cpu=cpu,
        refusals=refusals,
        ledger=(problems, warnings, entries, last_spend),
        work=work,
        hostile_nice=hostile_nice if patterns else None,
    )
    out["hostile_patterns"] = list(patterns)
    out["hostile_by_pattern"] = {
        p: int(sum(_merge_counts([root / f"hostile-{p}.json"])["codes"].values()))
        for p in patterns
        if p != "flood"
    }
    out["workdir"] = str(root) if keep else None
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return out


def _merge_counts(files: list[Path]) -> dict[str, Any]:
    """The hostile processes' counts, added up (a file that is missing counts nothing)."""
    codes: Counter = Counter()
    sent = 0
    for f in files:
        if f.is_file():
            data = json.loads(f.read_text())
            codes.update(data.get("codes", {}))
            sent += int(data.get("bytes", 0))
    return {"codes": dict(codes), "bytes": sent}


def _spawn_pattern(
    pattern: str, root: Path, dep: Any, pinned: Peer | None, address: str, duration: float
) -> Any:
    """A ``bench.hostile`` pattern in a process of its own: ``bytes`` with an unpinned
    certificate, the others as the pinned peer ``pinned``."""
    import multiprocessing as mp

    from dpda.bench.hostile import hostile_process
    from dpda.service.tls import init_party

    if pattern == "bytes":
        k = init_party(root / f"hostile-{pattern}", "mallory-b", ca_dir=root / "keys" / "ca")
    else:
        assert pinned is not None
        k = pinned.keys
    keys = {
        "cert": str(k.cert),
        "key": str(k.key),
        "ca": str(dep.source_keys.ca),
        "peer_ca": str(k.ca),
        "signing_key": str(k.signing_key),
        "signing_pub": str(k.signing_pub),
        "fingerprint": k.fingerprint,
        "source_fingerprint": dep.source_keys.fingerprint,
        "source_signing_pub": str(dep.source_keys.signing_pub),
    }
    proc = mp.get_context("spawn").Process(
        target=hostile_process,
        args=(pattern, str(root), address, keys, time.time() + duration,
              str(root / f"hostile-{pattern}.json"), 0),
        daemon=True,
    )  # fmt: skip
    proc.start()
    return proc


def _last_spend(state_dir: Path) -> float:
    import sqlite3

    db = state_dir / "state.sqlite"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        row = conn.execute(
            "SELECT entry_json FROM ledger WHERE dataset=? ORDER BY seq DESC LIMIT 1", (DATASET,)
        ).fetchone()
    finally:
        conn.close()
    return float(json.loads(row[0])["spend_after"]) if row else 0.0


def print_summary(out: dict[str, Any], file: Any = None) -> None:
    file = file or sys.stdout
    w = out["workload"]

    def p(line: str = "") -> None:
        print(line, file=file)

    p(
        f"load: {out['sessions']} honest sessions over {out['peers']} peer(s), "
        f"{out['duration_s']:g} s (wall {out['wall_s']:.1f} s), hostile client "
        f"{'on' if out['hostile_requests'] else 'off'}"
    )
    p(
        f"  each session: {w['steps']} minibatch releases + {w['pate_calls']} × "
        f"{w['pate_batch']} PATE queries; caps ε {w['dataset_cap']:g} (dataset), "
        f"{w['peer_cap']:g} (peer): set high for a load test"
    )
    p()
    p(f"  {'honest':<22} {'n':>8} {'p50 ms':>9} {'p99 ms':>9} {'max ms':>9}")
    for group in ("latency_by_method", "latency_by_operation"):
        for name, s in out[group].items():
            label = name if group == "latency_by_method" else f"op:{name}"
            p(
                f"  {label:<22} {s['n']:>8} {s['p50_ms']:>9.1f} {s['p99_ms']:>9.1f} "
                f"{s['max_ms']:>9.1f}"
            )
    p(
        f"  {'all RPCs':<22} {out['honest_rpcs']:>8} {out['p50_ms']:>9.1f} "
        f"{out['p99_ms']:>9.1f} {out['rpc_max_ms']:>9.1f}"
    )
    p()
    p(
        f"  sessions {out['sessions_opened']} opened / {out['sessions_closed']} closed, "
        f"{out['releases']} releases ({out['releases_per_s']:.1f}/s), {out['pate_calls']} "
        f"PATE calls ({out['pate_queries']} queries), {out['rpcs_per_s']:.1f} RPC/s"
    )
    retries = ", ".join(f"{k} {v}" for k, v in sorted(out["retries"].items())) or "none"
    p(f"  retries (protocol, not errors): {retries}")
    p(f"  honest errors: {out['errors']}")
    for m in out["error_messages"][:5]:
        p(f"    {m}")
    p(
        f"  hostile requests: {out['hostile_requests']} ({out['hostile_requests_per_s']:.0f}/s, "
        f"{out['hostile_mb_sent']:.0f} MB sent, nice {out['hostile_nice']}); served beyond the "
        f"health check open to any TLS client: {out['hostile_served']}"
    )
    for k, v in out["hostile_codes"].items():
        p(f"    {k:<40} {v:>8}")
    refusals = ", ".join(f"{k} {int(v)}" for k, v in sorted(out["source_refusals"].items()))
    p(f"  source refusals: {refusals or 'n/a'}")
    r = out["rss_mb"]
    p(
        f"  source RSS: peak {out['peak_rss_mb']:.1f} MB (VmHWM), start {r['start']:.1f}, "
        f"max sampled {r['max_sampled']:.1f}, end {r['end']:.1f} MB"
    )
    c = out["cpu_s"]
    p(
        f"  CPU seconds: source {c['source']:.1f}, honest clients {c['honest_clients']:.1f}, "
        f"hostile client {c['hostile_client']:.1f} ({c['cores']} cores; machine load "
        f"{c['loadavg_1min'][0]:.1f} → {c['loadavg_1min'][1]:.1f})"
    )
    lg = out["ledger"]
    p(
        f"  source ledger: {lg['entries']} entries, ε spent {lg['epsilon_spent']:.3f}, "
        f"verify: {len(lg['verify_problems'])} problem(s), {lg['verify_warnings']} warning(s)"
    )


def run_bench_load(args: argparse.Namespace) -> int:
    from dpda.bench.hostile import parse_patterns

    out = run_load(
        args.duration,
        args.sessions,
        peers=args.peers,
        workdir=Path(args.workdir) if args.workdir else None,
        work=Workload(steps=args.steps, pate_calls=args.pate_calls, pate_batch=args.pate_batch),
        hostile=() if args.no_hostile else parse_patterns(args.hostile),
        hostile_nice=args.hostile_nice,
    )
    print_summary(out)
    write_json(args, out)
    return 0 if out["errors"] == 0 and not out["ledger"]["verify_problems"] else 1


def register_load(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser(
        "load",
        help="concurrent honest sessions + PATE against one source daemon, with a hostile "
        "client flooding it: errors, latency percentiles, the source's peak RSS",
    )
    s.add_argument("--duration", type=float, default=300.0, metavar="S", help="seconds (300)")
    s.add_argument("--sessions", type=int, default=16, metavar="N", help="concurrent sessions")
    s.add_argument(
        "--peers",
        type=int,
        default=0,
        help="pinned target organizations the sessions are spread over (0: one per session)",
    )
    s.add_argument("--steps", type=int, default=4, help="minibatch releases per session")
    s.add_argument("--pate-calls", type=int, default=2, help="QueryTeachers calls per session")
    s.add_argument("--pate-batch", type=int, default=10, help="queries per call")
    s.add_argument("--no-hostile", action="store_true", help="no hostile client")
    s.add_argument(
        "--hostile",
        default="flood",
        metavar="PATTERNS",
        help="hostile patterns beside the honest clients, comma-separated, or all, or none: "
        "flood (an unpinned certificate's flood), bytes (concurrent 31 MiB messages from an "
        "unpinned certificate), hint (a pinned peer's planned-terms hints with the longest "
        "plan allowed), pate (a pinned peer's 100,000-query PATE requests). Default: flood",
    )
    s.add_argument(
        "--hostile-nice",
        type=int,
        default=10,
        help="CPU niceness of the hostile client's process (0: the same priority as the rest)",
    )
    s.add_argument("--workdir", default=None, help="keep the deployment and state here")
    add_json_option(s)
    s.set_defaults(func=run_bench_load)


def _spawn_hostile(
    root: Path, dep: Any, address: str, duration: float, out: Path, nice: int
) -> Any:
    """The hostile client in a process of its own, with a certificate the source never pinned."""
    import multiprocessing as mp

    from dpda.service.tls import init_party

    mallory = init_party(root / "hostile", "mallory", ca_dir=root / "keys" / "ca")
    proc = mp.get_context("spawn").Process(
        target=_hostile_main,
        args=(
            address,
            str(mallory.cert),
            str(mallory.key),
            str(dep.source_keys.ca),
            time.time() + duration,
            str(out),
            nice,
        ),
        daemon=True,
    )
    proc.start()
    return proc


def _result(
    rec: Recorder,
    sampler: RssSampler,
    flood: dict[str, Any],
    *,
    duration: float,
    sessions: int,
    peers: int,
    wall: float,
    stuck: int,
    peak_kb: int,
    rss_kb: tuple[int, int],
    cpu: dict[str, Any],
    refusals: Any,
    ledger: tuple[list[str], list[str], int, float],
    work: Workload,
    hostile_nice: int | None,
) -> dict[str, Any]:
    """The result dict (``REQUIRED_KEYS`` first) from what the run recorded."""
    problems, warnings, n_entries, last_spend = ledger
    hostile_codes: dict[str, int] = flood.get("codes", {})
    all_ms = [ms for v in rec.rpc_ms.values() for ms in v]
    overall = _percentiles(all_ms)
    n_err = len(rec.errors) + stuck
    out: dict[str, Any] = {
        "benchmark": "load",
        "sessions": sessions,
        "errors": n_err,
        "p50_ms": overall["p50_ms"],
        "p99_ms": overall["p99_ms"],
        "peak_rss_mb": round(peak_kb / 1024.0, 1),
        "hostile_requests": int(sum(hostile_codes.values())),
        "duration_s": duration,
        "wall_s": round(wall, 2),
        "peers": peers,
        "honest_rpcs": overall["n"],
        "rpc_timing": rec.timing,
        "rpc_max_ms": overall["max_ms"],
        "sessions_opened": rec.counts["sessions_opened"],
        "sessions_closed": rec.counts["sessions_closed"],
        "releases": rec.counts["releases"],
        "pate_calls": rec.counts["pate_calls"],
        "pate_queries": rec.counts["pate_queries"],
        "releases_per_s": round(rec.counts["releases"] / wall, 2),
        "rpcs_per_s": round(overall["n"] / wall, 2),
        "retries": dict(rec.retries),
        "honest_refusals": dict(rec.rpc_refused),
        "latency_by_method": {m: _percentiles(v) for m, v in sorted(rec.rpc_ms.items())},
        "latency_by_operation": {k: _percentiles(v) for k, v in sorted(rec.op_ms.items())},
        "error_messages": rec.errors[:20] + (["a client did not finish"] if stuck else []),
        "hostile_codes": dict(sorted(hostile_codes.items())),
        "hostile_served": sum(
            v
            for k, v in hostile_codes.items()
            if k.endswith(" OK")
            and not k.endswith(" Check OK")
            and not k.startswith(PINNED_KINDS)  # a pinned peer's own requests are served
        ),
        "hostile_mb_sent": round(flood.get("bytes", 0) / 2**20, 1),
        "hostile_requests_per_s": round(sum(hostile_codes.values()) / wall, 1),
        "hostile_nice": hostile_nice,
        "source_refusals": refusals,
        "cpu_s": cpu,
        "rss_mb": {
            "start": round(rss_kb[0] / 1024.0, 1),
            "max_sampled": round(max(sampler.samples, default=0) / 1024.0, 1),
            "end": round(rss_kb[1] / 1024.0, 1),
            "samples": len(sampler.samples),
        },
        "ledger": {
            "entries": n_entries,
            "epsilon_spent": last_spend,
            "verify_problems": problems[:10],
            "verify_warnings": len(warnings),
        },
        "workload": {
            **work.__dict__,
            "dataset_cap": DATASET_CAP,
            "peer_cap": PEER_CAP,
            "target_budget": TARGET_BUDGET,
            "delta": DELTA,
            "note": "caps set high for a load test (dataset cap: the config's maximum, 100): "
            "the honest sessions never run out of ε",
        },
    }
    return out
