"""The admin HTTP API of a daemon: a small ASGI app served by uvicorn in the daemon's process.

Routes (GET, JSON unless noted): ``/healthz`` (the process is up), ``/readyz`` (the daemon is
serving and the state file answers), ``/metrics`` (Prometheus text format), ``/v1/ledger``
(``?dataset=`` to filter), ``/v1/audit`` (records, never payload bytes), ``/openapi.json``.
These are read-only. A daemon may add routes (``extra``): the target adds its jobs API, whose
``POST /v1/jobs`` spends budget — so the token rule below matters.

Bound to 127.0.0.1 by default. On any other address a bearer token is required (the config
refuses to start otherwise) and every request without ``Authorization: Bearer <token>`` gets 401.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class Metrics:
    """The daemon's Prometheus metrics, in a registry of its own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.releases = Counter(
            "dpda_releases", "DP releases sent", ["dataset", "mechanism"], registry=self.registry
        )
        self.release_bytes = Counter(
            "dpda_release_bytes",
            "bytes of DP releases sent",
            ["dataset", "mechanism"],
            registry=self.registry,
        )
        self.epsilon = Gauge(
            "dpda_epsilon_spent",
            "ε of all events of the dataset after the latest entry of the peer (a bound for "
            "the attribute relation; see dpda_epsilon_by_relation for the record level)",
            ["dataset", "peer"],
            registry=self.registry,
        )
        self.epsilon_by_relation = Gauge(
            "dpda_epsilon_by_relation",
            "ε of the dataset per neighbouring relation (record: +Inf once any attribute-unit "
            "release exists, since those give no record-level guarantee)",
            ["dataset", "relation"],
            registry=self.registry,
        )
        self.refusals = Counter(
            "dpda_refusals",
            "requests refused, by public error code",
            ["code"],
            registry=self.registry,
        )
        self.refusals_unaudited = Counter(
            "dpda_refusals_unaudited",
            "refusals of unpinned callers not written to the audit log (one a second is)",
            ["code"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "dpda_rpc_latency_seconds", "gRPC handling time", ["method"], registry=self.registry
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


OPENAPI: dict[str, Any] = {
    "openapi": "3.0.3",
    "info": {"title": "dpda admin API", "version": "1"},
    "paths": {
        "/healthz": {"get": {"summary": "liveness", "responses": {"200": {"description": "up"}}}},
        "/readyz": {
            "get": {
                "summary": "readiness",
                "responses": {
                    "200": {"description": "serving"},
                    "503": {"description": "not ready"},
                },
            }
        },
        "/metrics": {
            "get": {
                "summary": "Prometheus metrics",
                "responses": {"200": {"description": "text exposition format"}},
            }
        },
        "/v1/ledger/totals": {
            "get": {
                "summary": "ε per dataset and neighbouring relation (record: null = unbounded)",
                "responses": {"200": {"description": "{dataset: {attribute, record}}"}},
            }
        },
        "/v1/ledger": {
            "get": {
                "summary": "ledger entries",
                "parameters": [
                    {
                        "name": "dataset",
                        "in": "query",
                        "required": False,
                        "schema": {"type": "string"},
                    }
                ],
                "responses": {"200": {"description": "JSON list of ledger entries"}},
            }
        },
        "/v1/audit": {
            "get": {
                "summary": "audit records (no payload bytes)",
                "responses": {"200": {"description": "JSON list of audit records"}},
            }
        },
        "/openapi.json": {
            "get": {
                "summary": "this schema",
                "responses": {"200": {"description": "OpenAPI 3 schema"}},
            }
        },
    },
    "components": {"securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
}


class AdminApp:
    """ASGI callable; ``ready()`` and the stores are injected by the composition root."""

    def __init__(
        self,
        metrics: Metrics,
        ledger_entries: Callable[[str | None], list[Any]],
        audit_records: Callable[[], list[Any]],
        ready: Callable[[], bool],
        token: str | None = None,
        extra: Callable[[str, str, bytes], tuple[int, str, bytes] | None] | None = None,
    ) -> None:
        self.metrics = metrics
        self.ledger_entries = ledger_entries
        self.audit_records = audit_records
        self.ready = ready
        self.token = token
        # (method, path, body) → response or None: routes a daemon adds (the target's jobs)
        self.extra = extra

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        body_in = b""
        if scope.get("method") == "POST":
            more = True
            while more and len(body_in) <= 1 << 20:
                msg = await receive()
                body_in += msg.get("body", b"")
                more = msg.get("more_body", False)
        status, ctype, body = self.handle(scope, body_in)
        headers = [(b"content-type", ctype.encode()), (b"cache-control", b"no-store")]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def _authorized(self, scope: Scope) -> bool:
        if self.token is None:
            return True
        for k, v in scope.get("headers", []):
            if k.lower() == b"authorization":
                return hmac.compare_digest(v, f"Bearer {self.token}".encode())
        return False

    def handle(self, scope: Scope, body: bytes = b"") -> tuple[int, str, bytes]:
        def js(code: int, data: Any) -> tuple[int, str, bytes]:
            return code, "application/json", json.dumps(data).encode()

        if not self._authorized(scope):
            return js(401, {"error": "missing or wrong bearer token"})
        method = scope.get("method", "GET")
        path = scope.get("path", "")
        if self.extra is not None:
            answer = self.extra(method, path, body)
            if answer is not None:
                return answer
        if method != "GET":
            return js(405, {"error": "method not allowed"})
        if path == "/healthz":
            return js(200, {"status": "ok"})
        if path == "/readyz":
            ok = self.ready()
            return js(200 if ok else 503, {"ready": ok})
        if path == "/metrics":
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.metrics.registry)
        if path == "/v1/ledger":
            raw = scope.get("query_string", b"").decode()
            query = dict(p.split("=", 1) for p in raw.split("&") if "=" in p)
            entries = self.ledger_entries(query.get("dataset"))
            return js(200, [json.loads(e.to_json()) for e in entries])
        if path == "/v1/ledger/totals":
            from .dp.ledger import totals_by_relation

            by_ds: dict[str, list[Any]] = {}
            for e in self.ledger_entries(None):
                by_ds.setdefault(e.dataset, []).append(e)
            return js(200, {ds: totals_by_relation(es) for ds, es in sorted(by_ds.items())})
        if path == "/v1/audit":
            return js(200, [asdict(r) for r in self.audit_records()])
        if path == "/openapi.json":
            return js(200, OPENAPI)
        return js(404, {"error": "not found"})


class AdminServer:
    """uvicorn in a background thread of the daemon; ``port`` once listening; ``stop()``."""

    def __init__(self, app: AdminApp, host: str, port: int) -> None:
        import uvicorn

        self.config = uvicorn.Config(
            app, host=host, port=port, log_level="warning", lifespan="on", access_log=False
        )
        self.server = uvicorn.Server(self.config)
        self.server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self.thread = threading.Thread(target=self.server.run, name="dpda-admin", daemon=True)
        self.port = 0

    def start(self, timeout: float = 30.0) -> int:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the admin HTTP server did not start")
            time.sleep(0.02)
        sock = self.server.servers[0].sockets[0]
        self.port = int(sock.getsockname()[1])
        return self.port

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
