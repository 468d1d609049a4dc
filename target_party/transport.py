"""The target's channel to the source: TLS with the source pinned by its certificate's
fingerprint (checked again whenever the connection drops), the client audit log, and retries
while the source is unavailable. gRPC errors become the package's own (``translate``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from dpda.errors import DpdaError, PeerMisbehaved
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.service import serde
from dpda.service.audit import AuditLog, ClientAuditInterceptor
from dpda.service.backoff import backoff
from dpda.service.config import TargetConfig
from dpda.service.status import from_rpc_error
from dpda.service.tls import channel_credentials, check_server_fingerprint

log = logging.getLogger("dpda.target")


def translate(exc: grpc.RpcError) -> DpdaError:
    """The package's error for a refusal by the source: the class it raised
    (``dpda.service.status``)."""
    return from_rpc_error(exc, "source")


class Retrying:
    """Calls the stub again, with exponential backoff, while the source is UNAVAILABLE.

    Safe because every request is idempotent: a release or an answer is identified by its
    request id (``session/index``), and the source returns the stored payload for a retried id
    without charging it again. Gives up after ``reconnect_s`` seconds.
    """

    def __init__(
        self,
        stub: pb_grpc.SourceServiceStub,
        reconnect_s: float,
        guard: Callable[[bool], None] = lambda dropped: None,
    ) -> None:
        self.stub = stub
        self.reconnect_s = reconnect_s
        self.guard = guard  # before each attempt: re-pins the source if the connection dropped

    def __getattr__(self, name: str):
        method = getattr(self.stub, name)

        def call(request, timeout=None):
            deadline = time.monotonic() + self.reconnect_s
            delays = backoff()
            dropped = False
            while True:
                self.guard(dropped)
                got: list[Any] = []
                try:
                    result = method(request, timeout=timeout)
                    if not hasattr(result, "__next__"):
                        return result
                    # a server stream is consumed here so that a broken stream is retried too;
                    # but what arrived before it broke is kept, not asked for again: it left
                    # the source (signed), which may have lost its own record of it since
                    for msg in result:
                        got.append(msg)
                    return got
                except grpc.RpcError as exc:
                    if got:
                        log.warning("the stream of %s broke after %d message(s)", name, len(got))
                        return got
                    code = exc.code() if hasattr(exc, "code") else None
                    if code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
                    delay = next(delays)
                    log.warning("source unavailable; retrying %s in %.1f s", name, delay)
                    time.sleep(delay)
                    dropped = True

        return call


class SourceTransport:
    """The audited, retrying channel to a source pinned by its certificate's fingerprint.

    ``stub`` is the ``Retrying`` stub every request goes through; ``channel`` the audited
    channel, ``raw_channel`` the one below the audit log.
    """

    def __init__(self, cfg: TargetConfig, audit: AuditLog) -> None:
        self.cfg = cfg
        # pin the source before any request carrying data goes out: mTLS alone would let any
        # holder of a certificate from the peer CA receive the target's basis and column
        # means. Raises PeerMisbehaved on another certificate.
        check_server_fingerprint(
            cfg.source_address,
            cfg.tls.cert,
            cfg.tls.key,
            cfg.tls.peer_ca,
            cfg.source_fingerprint,
            timeout=min(cfg.timeout_s, 30.0),
            retry_s=cfg.reconnect_s,
        )
        creds = channel_credentials(cfg.tls.cert, cfg.tls.key, cfg.tls.peer_ca)
        channel = grpc.secure_channel(
            cfg.source_address,
            creds,
            options=[
                ("grpc.max_receive_message_length", serde.MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", serde.MAX_MESSAGE_BYTES),
            ],
        )
        self.channel = grpc.intercept_channel(
            channel, ClientAuditInterceptor(audit, cfg.source_fingerprint)
        )
        self.stub = Retrying(pb_grpc.SourceServiceStub(self.channel), cfg.reconnect_s, self.guard)
        # gRPC reconnects on its own, to whoever listens at the address: every connection
        # state other than READY after the first READY means the next call may go to a new
        # server, so the pin is checked again first (``guard``)
        self._dropped = threading.Event()
        self._was_ready = False

        def watch(state: grpc.ChannelConnectivity) -> None:
            if state is grpc.ChannelConnectivity.READY:
                self._was_ready = True
            elif self._was_ready:
                self._dropped.set()

        channel.subscribe(watch, try_to_connect=False)
        self._watch = watch
        self.raw_channel = channel

    def guard(self, dropped: bool) -> None:
        """Before a call: if the connection dropped since the last check (a state change or an
        UNAVAILABLE), the certificate of whoever listens now must be the pinned one (a
        PeerMisbehaved ends the job); an unreachable source is left to the retry loop. The
        window between this handshake and gRPC's own reconnection stays open in principle (the
        Python API has no per-connection hook); it is milliseconds wide, not a whole restart."""
        if not (dropped or self._dropped.is_set()):
            return
        self._dropped.clear()
        try:
            check_server_fingerprint(
                self.cfg.source_address,
                self.cfg.tls.cert,
                self.cfg.tls.key,
                self.cfg.tls.peer_ca,
                self.cfg.source_fingerprint,
                timeout=min(self.cfg.timeout_s, 10.0),
            )
        except PeerMisbehaved:
            raise
        except DpdaError:
            self._dropped.set()  # not listening yet: check again before the next attempt

    def close(self) -> None:
        # unsubscribed first: closing a watched channel waits for gRPC's connectivity poller
        # (docs/results.md, "Service overhead")
        self.raw_channel.unsubscribe(self._watch)
        self.channel.close()
