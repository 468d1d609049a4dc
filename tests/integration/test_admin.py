"""The source's admin HTTP API: in the daemon process, loopback by default, token otherwise."""

from __future__ import annotations

import json
import re
import signal
import stat
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from dpda.deployment import SourceProcess, run_target
from dpda.errors import ConfigError
from dpda.service.config import AdminConfig, load_source

from .helpers import synthetic_deployment


def _get(port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_admin_api_of_a_running_daemon(tmp_path) -> None:
    dep = synthetic_deployment(tmp_path, peer_cap=4.5)
    src = SourceProcess(dep)
    try:
        port = int((dep.source_state / "admin_port").read_text())
        code, body = _get(port, "/healthz")
        assert code == 200 and json.loads(body) == {"status": "ok"}
        assert _get(port, "/readyz")[0] == 200
        res = run_target(dep)
        assert res.returncode == 0, res.stderr
        refused = run_target(dep)  # a second job of ε 4 does not fit the cap 4.5: refused
        assert refused.returncode != 0 and "budget" in refused.stderr
        token = (dep.source_state / "admin_token").read_text().strip()
        # what reveals the ledger's contents is behind the token, on loopback as well
        for path in ("/metrics", "/v1/ledger", "/v1/ledger/totals", "/v1/audit"):
            assert _get(port, path)[0] == 401, path
            assert _get(port, path, "wrong-token")[0] == 401, path
        assert _get(port, "/docs")[0] == 200  # the API's description holds no data
        assert stat.S_IMODE((dep.source_state / "admin_token").stat().st_mode) == 0o600
        code, body = _get(port, "/metrics", token)
        assert code == 200
        fams = {f.name: f for f in text_string_to_metric_families(body.decode())}
        rel = [s for s in fams["dpda_releases"].samples if s.name == "dpda_releases_total"]
        assert rel and rel[0].value == 1 and rel[0].labels["mechanism"].startswith("gaussian")
        eps = fams["dpda_epsilon_spent"].samples[0]
        assert eps.labels["peer"] == "target-org" and 0 < eps.value <= 4.5
        codes = {
            s.labels["code"]: s.value
            for s in fams["dpda_refusals"].samples
            if s.name == "dpda_refusals_total"
        }
        assert codes.get("BUDGET_EXCEEDED", 0) >= 1
        assert any(
            s.labels.get("method") == "ReleaseBatches"
            for s in fams["dpda_rpc_latency_seconds"].samples
        )
        ledger = json.loads(_get(port, "/v1/ledger?dataset=synthetic", token)[1])
        assert len(ledger) == 1 and ledger[0]["payload_sha256"]
        audit = json.loads(_get(port, "/v1/audit", token)[1])
        assert audit and all("payload" not in r for r in audit)
        spec = json.loads(_get(port, "/openapi.json")[1])
        assert set(spec["paths"]) >= {"/healthz", "/metrics", "/v1/ledger"}
        assert _get(port, "/nope", token)[0] == 404
        # the source's admin API has the same Host/Origin checks (DNS rebinding, issue 12)
        rebound = urllib.request.Request(f"http://127.0.0.1:{port}/v1/ledger")
        rebound.add_header("Host", f"evil.example:{port}")
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(rebound, timeout=10)
        assert e.value.code == 403 and b"Host" in e.value.read()
        # one shutdown path: SIGTERM stops gRPC and HTTP and the process exits cleanly
        src.proc.send_signal(signal.SIGTERM)
        assert src.proc.wait(timeout=20) == 0
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2)
    finally:
        src.stop()


def test_token_required_beyond_loopback(tmp_path) -> None:
    with pytest.raises(ValueError, match="token_file"):
        AdminConfig(listen="0.0.0.0:9000")
    assert AdminConfig(listen="0.0.0.0:9000", token_file=tmp_path / "t").token_file
    dep = synthetic_deployment(tmp_path)
    text = dep.source_config.read_text() + '\n[admin]\nlisten = "0.0.0.0:0"\n'
    dep.source_config.write_text(text)
    with pytest.raises(ConfigError, match="admin: .*token_file"):
        load_source(dep.source_config)


def test_bearer_token_is_checked(tmp_path) -> None:
    from dpda.service.admin import AdminApp
    from dpda.service.metrics import Metrics

    app = AdminApp(Metrics(), lambda ds: [], lambda: [], lambda: True, token="s3cret")
    assert app.handle({"path": "/v1/ledger", "headers": []})[0] == 401
    bad = [(b"authorization", b"Bearer nope")]
    assert app.handle({"path": "/v1/ledger", "headers": bad})[0] == 401
    good = [(b"authorization", b"Bearer s3cret")]
    assert app.handle({"path": "/v1/ledger", "headers": good})[0] == 200
    assert app.handle({"path": "/v1/ledger", "method": "POST", "headers": good})[0] == 405
    # a public path is public to reads only
    assert app.handle({"path": "/healthz", "method": "POST", "headers": []})[0] == 401
    assert app.handle({"path": "/metrics", "headers": []})[0] == 401
    bad = [(b"authorization", b"Bearer nope")]
    assert app.handle({"path": "/metrics", "headers": bad})[0] == 401
    good = [(b"authorization", b"Bearer s3cret")]
    assert app.handle({"path": "/metrics", "headers": good})[0] == 200
    assert app.handle({"path": "/healthz", "headers": []})[0] == 200  # says nothing of the ledger
    assert app.handle({"path": "/healthz", "method": "POST", "headers": []})[0] == 401
    assert app.handle({"path": "/healthz", "method": "POST", "headers": good})[0] == 405


def _scope(
    method: str = "GET",
    path: str = "/healthz",
    host: str | None = "127.0.0.1:8123",
    **headers: str,
) -> dict:
    hdrs = [] if host is None else [(b"host", host.encode())]
    hdrs += [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "method": method, "path": path, "headers": hdrs}


def test_host_origin_and_content_type_checks() -> None:
    """At the app level: what ``guard`` lets through to the routes."""
    from dpda.service.admin import AdminApp
    from dpda.service.metrics import Metrics

    app = AdminApp(Metrics(), lambda ds: [], lambda: [], lambda: True, allowed_hosts=("dpda.lan",))
    app.bind("127.0.0.1", 8123)
    for host in ("127.0.0.1:8123", "localhost:8123", "[::1]:8123", "dpda.lan:8123"):
        assert app.guard(_scope(host=host)) is None, host
    for host in (None, "evil.example:8123", "127.0.0.1:8124", "10.0.0.1:8123", "x:y", "[::1"):
        assert app.guard(_scope(host=host))[0] == 403, host
    assert app.guard(_scope(origin="http://127.0.0.1:8123")) is None
    assert app.guard(_scope(origin="http://evil.example"))[0] == 403
    ok = {"content_type": "application/json; charset=utf-8"}
    assert app.guard(_scope("POST", **ok)) is None
    assert app.guard(_scope("POST", content_type="text/plain"))[0] == 415
    assert app.guard(_scope("POST", content_length=str(1 << 20), **ok))[0] == 413
    # on a wildcard address: any IP literal (not a name: rebinding needs one), and allowed_hosts
    app.bind("0.0.0.0", 8123)
    assert app.guard(_scope(host="10.0.0.1:8123")) is None
    assert app.guard(_scope(host="dpda.lan:8123")) is None
    assert app.guard(_scope(host="evil.example:8123"))[0] == 403
    # an IPv6 listen address is matched bracketed
    app.bind("::1", 8123)
    assert app.guard(_scope(host="[::1]:8123")) is None


def test_state_changing_requests_need_a_token() -> None:
    from fastapi import APIRouter

    from dpda.service.admin import AdminApp
    from dpda.service.metrics import Metrics

    route = APIRouter()
    route.add_api_route("/v1/jobs", lambda: {}, methods=["POST"], status_code=202)

    # no token at all: the health checks only, nothing state-changing runs
    bare = AdminApp(Metrics(), lambda ds: [], lambda: [], lambda: True, routers=[route])
    assert bare.handle(_scope())[0] == 200
    assert bare.handle(_scope("POST", "/v1/jobs"))[0] == 401
    app = AdminApp(Metrics(), lambda ds: [], lambda: [], lambda: True, "t0k", [route])
    assert app.handle(_scope())[0] == 200
    assert app.handle(_scope("POST", "/v1/jobs"))[0] == 401
    assert app.handle(_scope("POST", "/v1/jobs", authorization="Bearer t0k"))[0] == 202


def test_with_a_token_every_read_of_data_needs_it_and_only_the_public_paths_are_open() -> None:
    """The rule docs/operations.md states: health, readiness and the API's description are open;
    the ledger, its totals, the audit log, the metrics and the jobs need the token."""
    from fastapi import APIRouter

    from dpda.service.admin import PUBLIC_PATHS, AdminApp
    from dpda.service.metrics import Metrics

    route = APIRouter()
    route.add_api_route("/v1/jobs", lambda: [], methods=["GET"])
    app = AdminApp(Metrics(), lambda ds: [], lambda: [], lambda: True, "t0k", [route])
    for path in ("/metrics", "/v1/ledger", "/v1/ledger/totals", "/v1/audit", "/v1/jobs"):
        code, _, body = app.handle(_scope(path=path))
        assert code == 401 and b"bearer token" in body, path
        assert app.handle(_scope(path=path, authorization="Bearer t0k"))[0] == 200, path
    assert PUBLIC_PATHS == {"/healthz", "/readyz", "/openapi.json", "/docs", "/redoc"}
    for path in (*PUBLIC_PATHS, "/docs/assets/swagger-ui-bundle.js"):
        assert app.handle(_scope(path=path))[0] == 200, path
    # the assets are an allow-list of files, not a folder: anything else is behind the token
    assert app.handle(_scope(path="/docs/assets/../../etc/passwd"))[0] == 401
    code, _, _ = app.handle(_scope(path="/docs/assets/index.html", authorization="Bearer t0k"))
    assert code == 404


def test_what_reveals_the_ledger_needs_the_token_and_health_does_not() -> None:
    """The ledger (entries, session ids, spend, parameters), its totals, the audit log and
    ``/metrics`` are read with the token only, with or without a token configured."""
    from dpda.service.admin import AdminApp
    from dpda.service.metrics import Metrics

    entries = [{"session": "s-secret"}]
    for token in ("t0k", None):
        app = AdminApp(Metrics(), lambda ds: entries, lambda: [], lambda: True, token)
        for path in ("/metrics", "/v1/ledger", "/v1/ledger/totals", "/v1/audit"):
            code, _, body = app.handle(_scope(path=path))
            assert code == 401 and b"s-secret" not in body, (token, path)
        for path in ("/healthz", "/readyz", "/openapi.json"):
            assert app.handle(_scope(path=path))[0] == 200, (token, path)
    assert app.handle(_scope(path="/metrics", authorization="Bearer t0k"))[0] == 401
    app = AdminApp(Metrics(), lambda ds: [], lambda: [], lambda: True, "t0k")
    assert app.handle(_scope(path="/metrics", authorization="Bearer t0k"))[0] == 200


def test_queries_are_decoded_and_every_error_is_returned() -> None:
    """``?dataset=office-caltech%3AC`` reached the ledger undecoded (an empty answer);
    a bad query answers 400 naming the field."""
    from dpda.service.admin import AdminApp
    from dpda.service.metrics import Metrics

    asked: list[str | None] = []
    app = AdminApp(Metrics(), lambda ds: asked.append(ds) or [], lambda: [], lambda: True, "t0k")
    auth = [(b"authorization", b"Bearer t0k")]
    scope = {"path": "/v1/ledger", "headers": auth, "query_string": b"dataset=office-caltech%3AC"}
    assert app.handle(scope)[0] == 200 and asked == ["office-caltech:C"]
    assert app.handle({"path": "/v1/ledger", "headers": auth})[0] == 200 and asked[-1] is None
    code, ctype, body = app.handle({"path": "/nope", "headers": auth})
    assert code == 404 and json.loads(body) == {"error": "not found"}


def test_the_openapi_schema_covers_every_route() -> None:
    """Generated from the routes (issue 14: the hand-kept schema lacked the jobs API)."""
    from dpda.service.admin import AdminApp
    from dpda.service.metrics import Metrics
    from dpda.target_party.jobs import OVERRIDABLE, JobRunner

    runner = JobRunner.__new__(JobRunner)  # the routes only: no config, no thread
    runner.jobs = {}
    app = AdminApp(Metrics(), lambda ds: [], lambda: [], lambda: True, routers=[runner.router()])
    code, _, body = app.handle({"path": "/openapi.json", "headers": []})
    spec = json.loads(body)
    routes = {getattr(r, "path", "") for r in app.api.routes} - {"", "/openapi.json"}
    routes -= {"/docs", "/redoc", "/docs/assets/{name}"}  # the schema's HTML pages, not in it
    routes |= {r.path for r in runner.router().routes if hasattr(r, "path")}
    assert code == 200 and routes == set(spec["paths"])
    assert {"/v1/jobs", "/v1/jobs/{job_id}", "/v1/jobs/{job_id}/report", "/metrics"} <= routes
    body_schema = spec["paths"]["/v1/jobs"]["post"]["requestBody"]["content"]["application/json"]
    assert set(body_schema["schema"]["properties"]) == set(OVERRIDABLE)
    # every reference resolves inside the document (a viewer fails on pydantic's "#/$defs/…")
    refs = re.findall(r'"\$ref": "([^"]+)"', json.dumps(spec))
    assert refs and all(r.startswith("#/components/schemas/") for r in refs), set(refs)
    assert all(r.rsplit("/", 1)[1] in spec["components"]["schemas"] for r in refs)
    assert spec["paths"]["/v1/ledger"]["get"]["parameters"][0]["name"] == "dataset"
    assert spec["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"


def test_docs_and_redoc_are_served_from_the_daemons_own_assets() -> None:
    """Offline: the pages name only this server's paths (no CDN), and the script they load is
    served by the daemon from the installed package."""
    import re

    from dpda.service.admin import AdminApp
    from dpda.service.metrics import Metrics

    app = AdminApp(Metrics(), lambda ds: [], lambda: [], lambda: True, "t0k")
    for path in ("/docs", "/redoc"):
        code, ctype, body = app.handle(_scope(path=path))
        assert code == 200 and ctype.startswith("text/html") and b"/openapi.json" in body
        page = body.decode()
        assert not re.search(r"https?://", page), re.findall(r"https?://[^'\" ]+", page)
        for src in re.findall(r"(?:src|href)=\"(/[^\"]+)\"", page):
            code, ctype, asset = app.handle(_scope(path=src))
            assert code == 200 and len(asset) > 100, src
    code, ctype, js = app.handle(_scope(path="/docs/assets/swagger-ui-bundle.js"))
    assert ctype.startswith("text/javascript") and b"SwaggerUIBundle" in js


def test_a_request_without_the_token_has_no_byte_of_its_body_read() -> None:
    """The token is checked before the body is received: a caller without it cannot make the
    admin port hold its bytes (the body was read, up to 64 KiB, before the 401)."""
    import asyncio

    from dpda.service.admin import AdminApp
    from dpda.service.metrics import Metrics

    app = AdminApp(Metrics(), lambda ds: [], lambda: [], lambda: True, token="t" * 43)
    app.bind("127.0.0.1", 8123)
    received: list[int] = []
    sent: list[dict] = []

    async def receive() -> dict:
        received.append(1)
        return {"type": "http.request", "body": b"{}" + b" " * 60_000, "more_body": False}

    async def send(msg: dict) -> None:
        sent.append(msg)

    scope = _scope("POST", "/v1/jobs", content_type="application/json", content_length="60002")
    asyncio.run(app(scope, receive, send))
    assert sent[0]["status"] == 401 and received == []
