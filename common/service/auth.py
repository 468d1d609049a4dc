"""Admission for the source's gRPC server: who may call what, how much, how big, how often.

The peer's identity is the fingerprint of its client certificate (mTLS). A peer listed in the
source's config has the role ``target``; anything else has no role and may call nothing but the
unary health ``Check`` (the streaming ``Watch`` is for pinned peers only). ``POLICY`` must name
every method of the generated servicer (a test ties them).

``AdmissionInterceptor`` is the outermost interceptor. It serves every method as a request
stream of one message, so it decides on the caller before gRPC receives the message, then
takes the message as *raw bytes* (gRPC's deserializer is replaced) and checks its size before
any parsing:

1. **role** — ``POLICY``; an unauthorized caller is refused before its message is received (an
   unpinned certificate's concurrent 31 MiB messages were each received whole, then denied);
2. **size** — each method has its own limit, derived from the real shapes (``method_limits``);
3. **rate** — a token bucket per pinned peer, and one shared by all unpinned callers;
4. **concurrency** — in-flight requests per pinned peer and for all unpinned callers together
   (else a few anonymous ``Watch`` streams could take every worker).

Role, rate and concurrency are decided before the message is received, size after it (gRPC's
``max_receive_message_length`` bounds the one message an admitted caller may send).

Only then is the message parsed (a malformed one is INVALID_ARGUMENT) and passed on. Every
refusal is reported to ``on_denied`` (log line, metric, audit record).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

SERVICE = "dpda.v1.SourceService"

POLICY: dict[str, frozenset[str]] = {
    f"/{SERVICE}/DescribeDataset": frozenset({"target"}),
    f"/{SERVICE}/OpenSession": frozenset({"target"}),
    f"/{SERVICE}/GetProjection": frozenset({"target"}),
    f"/{SERVICE}/ReleaseBatches": frozenset({"target"}),
    f"/{SERVICE}/QueryTeachers": frozenset({"target"}),
    f"/{SERVICE}/Countersign": frozenset({"target"}),
    f"/{SERVICE}/GetLedger": frozenset({"target"}),
    f"/{SERVICE}/RestoreLedger": frozenset({"target"}),
    f"/{SERVICE}/CloseSession": frozenset({"target"}),
    f"/{SERVICE}/OpenReweighting": frozenset({"target"}),
    f"/{SERVICE}/ReweightSteps": frozenset({"target"}),
    "/grpc.health.v1.Health/Check": frozenset({"target", "anonymous"}),
    # a Watch stream holds a server thread for as long as the caller likes: pinned peers only
    "/grpc.health.v1.Health/Watch": frozenset({"target"}),
}

SMALL_MESSAGE = 64 * 1024  # every request without arrays: ids, indexes, signatures, heads


def allowed(method: str, role: str | None) -> bool:
    roles = POLICY.get(method)
    return roles is not None and (role or "anonymous") in roles


def role_of(fingerprint: str | None, peers: set[str]) -> str | None:
    return "target" if fingerprint is not None and fingerprint in peers else None


def method_limits(max_features: int, max_message: int) -> dict[str, int]:
    """Receive limit per method from the real shapes: ``OpenSession`` carries the scaling (2·k
    floats) and at most a k × k basis; ``QueryTeachers`` at most ``max_message`` bytes of queries
    (the target splits larger query sets); ``RestoreLedger`` a peer's copy of ledger entries.
    Everything else is small."""
    k = max_features
    limits = {m: SMALL_MESSAGE for m in POLICY}
    limits[f"/{SERVICE}/OpenSession"] = min(max_message, SMALL_MESSAGE + 8 * (k * k + 2 * k) + 256)
    limits[f"/{SERVICE}/QueryTeachers"] = max_message
    limits[f"/{SERVICE}/RestoreLedger"] = max_message
    limits[f"/{SERVICE}/OpenReweighting"] = max_message  # the caller's public rows
    return limits


@dataclass
class _Bucket:
    rate: float
    burst: float
    tokens: float = field(init=False)
    stamp: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.burst

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False


@dataclass(frozen=True)
class Denial:
    method: str
    caller: str  # certificate fingerprint, or "anonymous" when none was presented
    role: str | None
    code: str  # public catalog code: PERMISSION_DENIED | OVERLOADED | INVALID_ARGUMENT
    reason: str  # for local logs only


class Admission:
    """The decisions, without gRPC (unit-testable)."""

    def __init__(
        self,
        peers: set[str],
        limits: dict[str, int],
        *,
        peer_concurrency: int,
        anonymous_concurrency: int,
        peer_rate: float,
        anonymous_rate: float,
    ) -> None:
        self.peers = set(peers)
        self.limits = dict(limits)
        self._lock = threading.Lock()
        self._inflight: dict[str, int] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._caps = {"target": peer_concurrency, "anonymous": anonymous_concurrency}
        self._rates = {"target": peer_rate, "anonymous": anonymous_rate}

    @staticmethod
    def _key(fingerprint: str | None, role: str | None) -> str:
        # all unpinned callers share one key: a flood cannot be spread over many certificates
        return fingerprint if role == "target" and fingerprint else "anonymous"

    def admit(self, method: str, fingerprint: str | None, size: int) -> tuple[str, Denial | None]:
        """(slot key, None) when admitted — the caller must ``release(key)`` — else a denial."""
        role = role_of(fingerprint, self.peers)
        caller = fingerprint or "anonymous"
        if not allowed(method, role):
            return "", Denial(method, caller, role, "PERMISSION_DENIED", "no role for method")
        if size > self.limits.get(method, SMALL_MESSAGE):
            return "", Denial(method, caller, role, "INVALID_ARGUMENT", f"message of {size} bytes")
        key = self._key(fingerprint, role)
        kind = "target" if role == "target" else "anonymous"
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                rate = self._rates[kind]
                bucket = self._buckets[key] = _Bucket(rate, max(1.0, 2 * rate))
            if not bucket.take():
                return "", Denial(method, caller, role, "OVERLOADED", "rate limit")
            if self._inflight.get(key, 0) >= self._caps[kind]:
                return "", Denial(method, caller, role, "OVERLOADED", "concurrency limit")
            self._inflight[key] = self._inflight.get(key, 0) + 1
        return key, None

    def release(self, key: str) -> None:
        with self._lock:
            self._inflight[key] -= 1


class AdmissionInterceptor:
    """gRPC server interceptor: ``Admission`` on raw bytes, then parse, then the inner handler."""

    def __init__(self, admission: Admission, on_denied: Callable[[Denial], None]) -> None:
        self.admission = admission
        self.on_denied = on_denied

    def __new__(cls, *args: Any, **kwargs: Any) -> AdmissionInterceptor:
        import grpc

        # subclass grpc.ServerInterceptor lazily so this module imports without grpc
        if not issubclass(cls, grpc.ServerInterceptor):
            cls = type(cls.__name__, (cls, grpc.ServerInterceptor), {})
        return object.__new__(cls)

    def intercept_service(self, continuation, handler_call_details):
        import grpc

        from dpda.service.status import STATUS, details_of
        from dpda.service.tls import peer_fingerprint

        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method
        admission, on_denied = self.admission, self.on_denied
        parse = handler.request_deserializer

        def deny(context, d: Denial) -> None:
            on_denied(d)
            context.abort(STATUS[d.code], details_of(d.code))

        def enter(requests: Iterator[bytes], context) -> tuple[str, Any]:
            # role, rate and concurrency before the message is read: gRPC receives a message
            # when the handler asks for it, so a refused caller's bytes are never buffered
            fp = peer_fingerprint(context)
            key, denial = admission.admit(method, fp, 0)
            if denial is not None:
                deny(context, denial)
            caller, role = fp or "anonymous", role_of(fp, admission.peers)
            try:
                raw = next(requests, None)
                if raw is None:
                    deny(context, Denial(method, caller, role, "INVALID_ARGUMENT", "no message"))
                    raise AssertionError("unreachable")
                size = len(raw)
                if size > admission.limits.get(method, SMALL_MESSAGE):
                    reason = f"message of {size} bytes"
                    deny(context, Denial(method, caller, role, "INVALID_ARGUMENT", reason))
                try:
                    return key, parse(raw) if parse is not None else raw
                except Exception:
                    reason = "undecodable"
                    deny(context, Denial(method, caller, role, "INVALID_ARGUMENT", reason))
                    raise AssertionError("unreachable") from None
            except BaseException:
                admission.release(key)
                raise

        # Every method is served as a request *stream* of one message (the wire is the same for
        # a unary caller): the handler then decides before the message is received.
        if handler.unary_unary:
            inner = handler.unary_unary

            def unary(requests, context):
                key, request = enter(requests, context)
                try:
                    return inner(request, context)
                finally:
                    admission.release(key)

            return grpc.stream_unary_rpc_method_handler(unary, None, handler.response_serializer)
        if handler.unary_stream:
            inner_s = handler.unary_stream

            def stream(requests, context):
                key, request = enter(requests, context)
                try:
                    yield from inner_s(request, context)
                finally:
                    admission.release(key)

            return grpc.stream_stream_rpc_method_handler(stream, None, handler.response_serializer)

        # no streaming-request methods exist; refuse anything else rather than pass it unchecked
        def refuse(request_iterator, context):
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "UNIMPLEMENTED")

        return grpc.stream_unary_rpc_method_handler(refuse)
