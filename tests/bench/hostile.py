"""The hostile patterns of ``dpda bench load --hostile``, each in a process of its own.

* ``flood`` (``flood_process``): an unpinned certificate's multi-MB ``OpenSession``
  messages, health ``Watch`` streams, garbage to every method, a new TLS connection per request.
* ``bytes``: an unpinned certificate sends ``BYTES_STREAMS`` concurrent messages of
  ``BYTES_MESSAGE`` bytes, over and over (each is refused; what counts is the memory the source
  holds for them before it refuses).
* ``hint``: a pinned peer turned hostile sends sessionless, unsigned planned-terms hints
  (``DescribeDataset.planned_terms_json``) whose plan is as long as the source allows:
  minibatches as large as the dataset, ``HINT_STEPS`` steps.
* ``pate``: the same pinned peer opens a PATE session and asks for ``PATE_QUERIES`` answers of
  ``PATE_TEACHERS`` teachers per request, over and over (each verified and countersigned, as a
  real target would).
* ``plan``: the same pinned peer keeps ``PLAN_STREAMS`` signed ``OpenSession`` requests
  planning at once, each with LNMax answers to ``PATE_QUERIES`` queries and a fresh
  ``pate_epsilon`` (no cached plan answers it; seconds of calibration each): the planning
  monopoly. The honest peers' ``OpenSession`` must still succeed.

Every pattern runs in a process of its own (``flood_process``, ``hostile_process``), so that
its CPU is not taken from the honest clients' threads; each writes
``{"codes": {"kind CODE": n}, "bytes": n}``.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from tests.bench.load_honest import Peer

PATTERNS = ("flood", "bytes", "hint", "pate", "plan")
UNPINNED = ("flood", "bytes")  # the rest need a pinned peer's keys
BYTES_STREAMS = 8
BYTES_MESSAGE = 31 * 2**20
HINT_STEPS = 10_000
PATE_QUERIES = 100_000
PATE_TEACHERS = 600
PLAN_STREAMS = 8


def parse_patterns(text: str) -> tuple[str, ...]:
    """``all``, ``none`` or a comma-separated list of ``PATTERNS``."""
    text = text.strip().lower()
    if text == "all":
        return PATTERNS
    if text in ("", "none"):
        return ()
    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in names if p not in PATTERNS]
    if unknown:
        raise ValueError(
            f"--hostile: {', '.join(unknown)} is not one of all, none, {', '.join(PATTERNS)}"
        )
    return names


class Tally:
    """The counts a pattern writes when it ends."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.codes: Counter = Counter()
        self.bytes = 0

    def call(self, kind: str, fn: Callable[[], object], size: int = 0) -> None:
        import grpc

        with self.lock:
            self.bytes += size
        try:
            fn()
            code = "OK"
        except grpc.RpcError as exc:
            code = exc.code().name if hasattr(exc, "code") else "ERROR"
        except Exception as exc:
            code = type(exc).__name__
        with self.lock:
            self.codes[f"{kind} {code}"] += 1

    def write(self, out: Path) -> None:
        out.write_text(json.dumps({"codes": dict(self.codes), "bytes": self.bytes}))


HOSTILE_BIG_BYTES = 4 * 1024 * 1024
# --------------------------------------------------------------------------------- flood
HEALTH_CHECK = "/grpc.health.v1.Health/Check"


def flood_process(
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


def spawn_flood(root: Path, dep: Any, address: str, duration: float, out: Path, nice: int) -> Any:
    """The hostile client in a process of its own, with a certificate the source never pinned."""
    import multiprocessing as mp

    from dpda.service.tls import init_party

    mallory = init_party(root / "hostile", "mallory", ca_dir=root / "keys" / "ca")
    proc = mp.get_context("spawn").Process(
        target=flood_process,
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


def spawn_pattern(
    pattern: str, root: Path, dep: Any, pinned: Peer | None, address: str, duration: float
) -> Any:
    """A ``bench.hostile`` pattern in a process of its own: ``bytes`` with an unpinned
    certificate, the others as the pinned peer ``pinned``."""
    import multiprocessing as mp

    from dpda.service.tls import init_party
    from tests.bench.hostile import hostile_process

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


def merge_counts(files: list[Path]) -> dict[str, Any]:
    """The hostile processes' counts, added up (a file that is missing counts nothing)."""
    codes: Counter = Counter()
    sent = 0
    for f in files:
        if f.is_file():
            data = json.loads(f.read_text())
            codes.update(data.get("codes", {}))
            sent += int(data.get("bytes", 0))
    return {"codes": dict(codes), "bytes": sent}


def _bytes(address: str, creds: Any, stop: threading.Event, tally: Tally) -> None:
    import grpc

    opts = [("grpc.max_send_message_length", BYTES_MESSAGE + 2**20)]
    payload = b"x" * BYTES_MESSAGE  # refused for the caller, whatever it holds

    def stream() -> None:
        with grpc.secure_channel(address, creds, options=opts) as ch:
            call = ch.unary_unary("/dpda.v1.SourceService/OpenSession")
            while not stop.is_set():
                tally.call("bytes OpenSession", lambda: call(payload, timeout=30), len(payload))

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(BYTES_STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def hint_terms() -> str:
    from dpda.dp.mechanisms import PrivacyUnit
    from dpda.terms import SessionTerms
    from tests.bench.load_honest import DATASET, DELTA, SOURCE_ROWS

    return SessionTerms(
        dataset=DATASET,
        epsilon=8.0,
        delta=DELTA,
        privacy_unit=PrivacyUnit.ATTRIBUTE,
        release="rows",
        batch_size=SOURCE_ROWS,
        steps=HINT_STEPS,
        max_steps=HINT_STEPS,
        noise_multiplier=0.0,
        projection="jl",
        projection_dim=5,
    ).model_dump_json()


def _hint(src: Any, stop: threading.Event, tally: Tally) -> None:
    from dpda.pb import dpda_pb2 as pb
    from tests.bench.load_honest import DATASET

    terms = hint_terms()
    stub = src.stub.stub
    i = 0
    while not stop.is_set():
        i += 1  # a different ε each time: no cached plan answers it
        text = terms.replace('"epsilon":8.0', f'"epsilon":{8.0 - i * 1e-6!r}')
        req = pb.DescribeDatasetRequest(dataset=DATASET, planned_terms_json=text)
        tally.call("hint DescribeDataset", _bind(stub.DescribeDataset, req, timeout=30))
        stop.wait(0.5)


def _pate(src: Any, basis: Any, queries: Any, stop: threading.Event, tally: Tally) -> None:
    import numpy as np

    from dpda.dp.mechanisms import PrivacyUnit
    from dpda.protocol import TargetDisclosure
    from dpda.terms import SessionTerms
    from tests.bench.load_honest import DATASET, DELTA

    terms = SessionTerms(
        dataset=DATASET,
        epsilon=1.0,
        delta=DELTA,
        privacy_unit=PrivacyUnit.ATTRIBUTE,
        release="rows",
        projection="target-pca",
        projection_dim=basis.shape[1],
        batch_size=60,
        steps=1,
        noise_multiplier=20.0,
        pate_epsilon=0.1,
        pate_queries=PATE_QUERIES,
        pate_teachers=PATE_TEACHERS,
    )
    reps = -(-PATE_QUERIES // queries.shape[0])
    q = np.ascontiguousarray(np.tile(queries, (reps, 1))[:PATE_QUERIES])
    while not stop.is_set():
        src.job_file.unlink(missing_ok=True)
        try:
            info = src.open_session(terms, TargetDisclosure(None, basis))
        except Exception as exc:
            tally.codes[f"pate OpenSession {type(exc).__name__}"] += 1
            stop.wait(1.0)
            continue
        tally.call("pate QueryTeachers", _bind(src.query_teachers, info.session_id, 0, q), q.nbytes)
        try:
            src.close_session(info.session_id)
        except Exception:
            pass


def plan_terms(i: int) -> str:
    """Terms whose plan is seconds of calibration: LNMax over ``PATE_QUERIES`` queries, at a
    ``pate_epsilon`` of its own (``i``), so that no cached plan answers it."""
    from dpda.dp.mechanisms import PrivacyUnit
    from dpda.terms import SessionTerms
    from tests.bench.load_honest import DATASET, DELTA

    return SessionTerms(
        dataset=DATASET,
        epsilon=1.0,
        delta=DELTA,
        privacy_unit=PrivacyUnit.ATTRIBUTE,
        release="rows",
        projection="jl",
        projection_dim=5,
        batch_size=60,
        steps=1,
        noise_multiplier=20.0,
        pate_epsilon=0.5 - i * 1e-7,
        pate_queries=PATE_QUERIES,
        pate_aggregator="lnmax",
    ).model_dump_json()


def _plan(src: Any, signing_key: Path, stop: threading.Event, tally: Tally) -> None:
    from dpda.pb import dpda_pb2 as pb
    from dpda.service import signing

    key = signing.load_private(signing_key)
    stub = src.stub.stub
    counter = iter(range(1, 10**9))
    lock = threading.Lock()

    def stream() -> None:
        while True:  # one request at least, even when the process starts late in a short run
            with lock:
                i = next(counter)
            text = plan_terms(i)
            req = pb.OpenSessionRequest(
                terms_json=text, target_sig=signing.sign(key, text.encode())
            )
            tally.call("plan OpenSession", _bind(stub.OpenSession, req, timeout=60))
            if stop.is_set():
                return

    threads = [threading.Thread(target=stream, daemon=True) for _ in range(PLAN_STREAMS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _bind(fn: Callable[..., object], *args: Any, **kw: Any) -> Callable[[], object]:
    return lambda: fn(*args, **kw)


def hostile_process(
    pattern: str, root: str, address: str, keys: dict[str, str], until: float, out: str, nice: int
) -> None:
    """One pattern, in a process of its own, until ``until`` (``time.time()``)."""
    if nice:
        os.nice(nice)
    from dpda.service.tls import channel_credentials

    stop = threading.Event()
    tally = Tally()
    creds = channel_credentials(Path(keys["cert"]), Path(keys["key"]), Path(keys["ca"]))
    if pattern == "bytes":
        worker = threading.Thread(target=_bytes, args=(address, creds, stop, tally), daemon=True)
    else:
        from dpda.service.tls import PartyKeys
        from tests.bench.load_honest import Peer, Recorder, honest_client, target_view

        party = PartyKeys(
            cert=Path(keys["cert"]),
            key=Path(keys["key"]),
            ca=Path(keys["peer_ca"]),
            signing_key=Path(keys["signing_key"]),
            signing_pub=Path(keys["signing_pub"]),
            fingerprint=keys["fingerprint"],
        )
        dep = _Dep(keys)
        index = 900 + PATTERNS.index(pattern)  # a state directory of its own per pattern
        src = honest_client(
            Path(root), index, Peer("mallory-pinned", party), dep, address, Recorder()
        )
        if pattern == "hint":
            worker = threading.Thread(target=_hint, args=(src, stop, tally), daemon=True)
        elif pattern == "plan":
            args = (src, party.signing_key, stop, tally)
            worker = threading.Thread(target=_plan, args=args, daemon=True)
        else:
            basis, queries = target_view(10)
            worker = threading.Thread(
                target=_pate, args=(src, basis, queries, stop, tally), daemon=True
            )
    worker.start()
    while time.time() < until and worker.is_alive():
        time.sleep(0.1)
    stop.set()
    worker.join(timeout=60)
    tally.write(Path(out))


class _Dep:
    """What ``bench.load_honest.honest_client`` reads of a deployment: the source's keys."""

    def __init__(self, keys: dict[str, str]) -> None:
        from types import SimpleNamespace

        self.source_keys = SimpleNamespace(
            fingerprint=keys["source_fingerprint"], signing_pub=Path(keys["source_signing_pub"])
        )
