"""The hostile patterns of ``dpda bench load --hostile``, beside the flood of ``bench.load``.

* ``flood`` (``bench.load._hostile_main``): an unpinned certificate's multi-MB ``OpenSession``
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

Every pattern runs in a process of its own (``hostile_process``), so that its CPU is not taken
from the honest clients' threads; each writes ``{"codes": {"kind CODE": n}, "bytes": n}``.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

PATTERNS = ("flood", "bytes", "hint", "pate")
UNPINNED = ("flood", "bytes")  # the rest need a pinned peer's keys
BYTES_STREAMS = 8
BYTES_MESSAGE = 31 * 2**20
HINT_STEPS = 10_000
PATE_QUERIES = 100_000
PATE_TEACHERS = 600


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
    from dpda.bench.load import DATASET, DELTA, SOURCE_ROWS
    from dpda.dp.mechanisms import PrivacyUnit
    from dpda.terms import SessionTerms

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
    from dpda.bench.load import DATASET
    from dpda.pb import dpda_pb2 as pb

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

    from dpda.bench.load import DATASET, DELTA
    from dpda.dp.mechanisms import PrivacyUnit
    from dpda.protocol import TargetDisclosure
    from dpda.terms import SessionTerms

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
        from dpda.bench.load import Peer, Recorder, _client, _target_view
        from dpda.service.tls import PartyKeys

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
        src = _client(Path(root), index, Peer("mallory-pinned", party), dep, address, Recorder())
        if pattern == "hint":
            worker = threading.Thread(target=_hint, args=(src, stop, tally), daemon=True)
        else:
            basis, queries = _target_view(10)
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
    """What ``bench.load._client`` reads of a deployment: the source's keys."""

    def __init__(self, keys: dict[str, str]) -> None:
        from types import SimpleNamespace

        self.source_keys = SimpleNamespace(
            fingerprint=keys["source_fingerprint"], signing_pub=Path(keys["source_signing_pub"])
        )
