"""The admin HTTP API of a daemon: a small ASGI app served by uvicorn in the daemon's process.

Routes (GET, JSON unless noted): ``/healthz`` (the process is up), ``/readyz`` (the daemon is
serving and the state file answers), ``/metrics`` (Prometheus text format), ``/v1/ledger``
(``?dataset=`` to filter), ``/v1/audit`` (records, never payload bytes), ``/openapi.json``.
These are read-only. A daemon may add routes (``extra``): the target adds its jobs API, whose
``POST /v1/jobs`` spends budget (``target_party.jobs``).

Every request, on every address, passes these checks first (issue 12, item 5), refused with a
JSON ``{"error": ...}`` that names what was wrong:

* ``Host`` (403): exactly one, naming this server — the listen host, ``localhost``,
  ``127.0.0.1`` or ``[::1]`` (plus ``[admin] allowed_hosts``; on a wildcard listen address
  also any IP literal) — with the bound port. A DNS-rebinding page reaches the socket under the
  attacker's name, so its Host never matches.
* ``Origin`` (403): absent (curl, scripts, Prometheus), or this server's own origin
  ``http://<Host>``. A page on another origin is refused even for a "simple" ``text/plain`` POST
  the browser sends without a preflight (CSRF).
* A state-changing request (any method but GET/HEAD) must carry ``Content-Type:
  application/json`` (415), which no cross-origin page can send without a CORS preflight that
  this API never answers, and a body of at most ``MAX_BODY`` bytes (413).

Then the bearer token (401 without ``Authorization: Bearer <token>``):

* with a configured ``token_file`` every request needs it. Beyond loopback one is required (the
  config refuses to start otherwise);
* ``open_reads`` (the target's default token, generated at start when no ``token_file`` is
  configured): read-only GETs stay open on loopback — metrics, ledger, audit and job views are
  what a local operator or Prometheus reads, and the Host and Origin checks keep browsers out —
  while every state-changing request needs the token;
* with no token at all (the source on loopback) reads are open and state-changing requests are
  refused: nothing can spend budget through an API without a token.
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


MAX_BODY = 64 * 1024  # bytes of a request body; more gets 413
SAFE_METHODS = frozenset({"GET", "HEAD"})
_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
_WILDCARDS = ("", "0.0.0.0", "::")

Answer = tuple[int, str, bytes]


def _js(code: int, data: Any) -> Answer:
    return code, "application/json", json.dumps(data).encode()


def _headers(scope: Scope, name: bytes) -> list[str]:
    return [v.decode("latin-1") for k, v in scope.get("headers", []) if k.lower() == name]


def _shown(value: str) -> str:
    return value if len(value) <= 80 else value[:80] + "…"


def _split_host(host: str) -> tuple[str, int | None] | None:
    """``name[:port]`` of a Host header (IPv6 bracketed) → (lower-case name, port or None)."""
    host = host.strip().lower()
    if host.startswith("["):
        name, sep, rest = host.partition("]")
        name += sep
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:] if rest else None
    else:
        name, sep, port_s = host.partition(":")
        port = port_s if sep else None
    if not name or name == "[]":
        return None
    if port is None:
        return name, None
    if not port.isdigit() or len(port) > 5:
        return None
    return name, int(port)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


class AdminApp:
    """ASGI callable; ``ready()`` and the stores are injected by the composition root.

    ``token``: the bearer token, or None. ``open_reads``: GET/HEAD need no token (the target's
    generated token guards only its state-changing requests); default: every request needs the
    token when there is one. ``allowed_hosts``: Host names accepted besides the listen host and
    the loopback names. ``bind(host, port)`` (``AdminServer.start`` calls it) sets what the Host
    header must name.
    """

    def __init__(
        self,
        metrics: Metrics,
        ledger_entries: Callable[[str | None], list[Any]],
        audit_records: Callable[[], list[Any]],
        ready: Callable[[], bool],
        token: str | None = None,
        extra: Callable[[str, str, bytes], tuple[int, str, bytes] | None] | None = None,
        *,
        open_reads: bool = False,
        allowed_hosts: tuple[str, ...] = (),
    ) -> None:
        self.metrics = metrics
        self.ledger_entries = ledger_entries
        self.audit_records = audit_records
        self.ready = ready
        self.token = token
        self.open_reads = open_reads
        # (method, path, body) → response or None: routes a daemon adds (the target's jobs)
        self.extra = extra
        self.allowed_hosts = tuple(h.lower() for h in allowed_hosts)
        self.port: int | None = None
        self.host_names: frozenset[str] = frozenset((*_LOOPBACK_NAMES, *self.allowed_hosts))
        self.wildcard = False

    def bind(self, host: str, port: int) -> None:
        """The address the server listens on: the Host header must name it (with this port)."""
        self.port = port
        bare = host.strip("[]").lower()
        names = {*_LOOPBACK_NAMES, *self.allowed_hosts}
        self.wildcard = bare in _WILDCARDS
        if not self.wildcard:
            names.add(f"[{bare}]" if ":" in bare else bare)
        self.host_names = frozenset(names)

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
        answer = self.guard(scope)
        body_in = b""
        if answer is None and scope.get("method", "GET") not in SAFE_METHODS:
            more = True
            while more:
                msg = await receive()
                body_in += msg.get("body", b"")
                more = msg.get("more_body", False)
                if len(body_in) > MAX_BODY:
                    answer = _js(413, {"error": f"request body: more than {MAX_BODY} bytes"})
                    break
        status, ctype, body = answer or self.handle(scope, body_in)
        headers = [
            (b"content-type", ctype.encode()),
            (b"cache-control", b"no-store"),
            (b"x-content-type-options", b"nosniff"),
        ]
        if status == 401:
            headers.append((b"www-authenticate", b"Bearer"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    def guard(self, scope: Scope) -> Answer | None:
        """Host, Origin, Content-Type and Content-Length checks of a request (see the module
        docstring); None when it may go on to the token check and the routes."""
        hosts = _headers(scope, b"host")
        if len(hosts) != 1:
            return _js(403, {"error": "Host header: missing or repeated"})
        port = self.port
        if port is None and scope.get("server"):
            port = int(scope["server"][1])
        parsed = _split_host(hosts[0])
        if parsed is None:
            return _js(403, {"error": f"Host header {_shown(hosts[0])!r}: malformed"})
        name, host_port = parsed
        if host_port != port and not (host_port is None and port == 80):
            return _js(
                403,
                {
                    "error": f"Host header {_shown(hosts[0])!r}: wrong port "
                    f"(this admin API listens on port {port}); refused against DNS rebinding"
                },
            )
        if name not in self.host_names and not (self.wildcard and _is_ip(name)):
            return _js(
                403,
                {
                    "error": f"Host header {_shown(hosts[0])!r}: not a name of this admin API "
                    f"(use one of {sorted(self.host_names)}, or add it to [admin] allowed_hosts);"
                    " refused against DNS rebinding"
                },
            )
        origins = _headers(scope, b"origin")
        if origins and (len(origins) > 1 or origins[0].lower() != f"http://{hosts[0].lower()}"):
            return _js(
                403,
                {
                    "error": f"Origin header {_shown(origins[0])!r}: not this admin API's origin "
                    f"(http://{_shown(hosts[0])}); cross-origin requests are refused"
                },
            )
        if scope.get("method", "GET") in SAFE_METHODS:
            return None
        ctypes = _headers(scope, b"content-type")
        media = ctypes[0].split(";", 1)[0].strip().lower() if len(ctypes) == 1 else ""
        if media != "application/json":
            got = _shown(ctypes[0]) if ctypes else "none"
            return _js(
                415,
                {
                    "error": f"Content-Type: {got!r}; a state-changing request must send "
                    "application/json"
                },
            )
        lengths = _headers(scope, b"content-length")
        if lengths and (not lengths[0].strip().isdigit() or int(lengths[0]) > MAX_BODY):
            return _js(413, {"error": f"request body: more than {MAX_BODY} bytes"})
        return None

    def _refusal(self, scope: Scope, method: str) -> str | None:
        """Why the bearer token check fails, or None when it passes."""
        if method in SAFE_METHODS and (self.token is None or self.open_reads):
            return None
        if self.token is None:
            return "this daemon has no admin token; state-changing requests are refused"
        given = _headers(scope, b"authorization")
        expected = f"Bearer {self.token}".encode()
        if len(given) == 1 and hmac.compare_digest(given[0].encode("latin-1"), expected):
            return None
        return "missing or wrong bearer token"

    def handle(self, scope: Scope, body: bytes = b"") -> Answer:
        """The token check and the routes (``__call__`` runs ``guard`` first)."""
        js = _js
        method = scope.get("method", "GET")
        refusal = self._refusal(scope, method)
        if refusal is not None:
            return js(401, {"error": refusal})
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
            from dpda.dp.ledger import totals_by_relation

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

        self.app = app
        self.host = host
        self.config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level="warning",
            lifespan="on",
            access_log=False,
            proxy_headers=False,  # the checks read the request's own headers, never X-Forwarded-*
            server_header=False,
        )
        self.server = uvicorn.Server(self.config)
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
        self.app.bind(self.host, self.port)
        return self.port

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
