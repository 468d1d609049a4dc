"""The target's job API (``dpda target serve``) against browsers and callers.

9ac3bc1, on loopback with no token (the default): a ``text/plain`` POST from a foreign origin
started a job (CSRF; DNS rebinding with a foreign Host as well); ``data_kind = table, data_path =
<any readable file>`` made the daemon send that file's column means and principal directions to
the source; ``synthetic_rows`` had no bound (one request tried to allocate 14.9 GiB). Each
request below is refused with the problem named, and no job starts; an honest JSON POST with the
generated token still runs a job.
"""

from __future__ import annotations

import http.client
import json
import os
import stat
import time
from pathlib import Path

import pytest

from dpda.deployment import SourceProcess
from dpda.errors import ConfigError
from dpda.service.config import load_target
from dpda.target_party.jobs import admin_token

from .helpers import start_target_serve, synthetic_deployment


def _call(
    port: int,
    method: str,
    path: str,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict]:
    """One request with exactly these headers (Host defaults to 127.0.0.1:port)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        hdrs = {"Host": f"127.0.0.1:{port}", **(headers or {})}
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        for k, v in hdrs.items():
            conn.putheader(k, v)
        if data is not None:
            conn.putheader("Content-Length", str(len(data)))
        conn.endheaders(data)
        r = conn.getresponse()
        raw = r.read()
        ctype = r.getheader("content-type", "")
        return r.status, json.loads(raw) if ctype.startswith("application/json") else {}
    finally:
        conn.close()


_TOKEN: dict[int, str] = {}  # admin port → the token ``serve`` generated


@pytest.fixture(scope="module")
def daemons(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("jobapi")
    dep = synthetic_deployment(tmp)
    src = SourceProcess(dep)
    tgt, port = start_target_serve(dep, tmp / "target.log")
    token_file = dep.target_state / "admin_token"
    _TOKEN[port] = token_file.read_text().strip()
    try:
        yield dep, port, _TOKEN[port]
    finally:
        tgt.terminate()
        tgt.wait(timeout=20)
        src.stop()


def _honest(port: int, token: str, **extra: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {token}",
        **extra,
    }


def _no_job_started(port: int) -> None:
    code, jobs = _call(port, "GET", "/v1/jobs", headers={"Authorization": f"Bearer {_TOKEN[port]}"})
    assert code == 200 and jobs == []


def test_the_token_is_generated_private_and_announced(daemons) -> None:
    dep, _, token = daemons
    path = dep.target_state / "admin_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.stat().st_uid == os.geteuid()
    assert len(token) >= 32
    log = (dep.workdir / "target.log").read_text()
    assert str(path) in log


def test_foreign_origin_is_refused(daemons) -> None:
    """CSRF: a page elsewhere POSTs (a "simple" request the browser sends without asking)."""
    _, port, token = daemons
    for origin in ("http://evil.example", "null", f"http://localhost:{port}"):
        code, body = _call(
            port, "POST", "/v1/jobs", {"epsilon": 1.0}, _honest(port, token, Origin=origin)
        )
        assert code == 403 and "Origin" in body["error"], (origin, body)
    # the same origin as the Host is fine for reads (with the token)
    same = {"Origin": f"http://127.0.0.1:{port}", "Authorization": f"Bearer {token}"}
    code, _ = _call(port, "GET", "/v1/ledger", headers=same)
    assert code == 200
    _no_job_started(port)


def test_foreign_host_is_refused(daemons) -> None:
    """DNS rebinding: the attacker's name resolves to 127.0.0.1; the Host header keeps it."""
    _, port, token = daemons
    for host in (f"evil.example:{port}", "127.0.0.1:1", "127.0.0.1", f"127.0.0.2:{port}"):
        code, body = _call(port, "GET", "/v1/ledger", headers={"Host": host})
        assert code == 403 and "Host" in body["error"], (host, body)
        code, body = _call(
            port, "POST", "/v1/jobs", {"epsilon": 1.0}, _honest(port, token, Host=host)
        )
        assert code == 403 and "Host" in body["error"], (host, body)
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"LOCALHOST:{port}"):
        assert _call(port, "GET", "/healthz", headers={"Host": host})[0] == 200, host
    _no_job_started(port)


def test_text_plain_is_refused(daemons) -> None:
    _, port, token = daemons
    for ctype in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        headers = _honest(port, token)
        headers["Content-Type"] = ctype
        code, body = _call(port, "POST", "/v1/jobs", b'{"epsilon": 1.0}', headers)
        assert code == 415 and "Content-Type" in body["error"] and ctype in body["error"]
    headers = _honest(port, token)
    del headers["Content-Type"]
    assert _call(port, "POST", "/v1/jobs", b'{"epsilon": 1.0}', headers)[0] == 415
    _no_job_started(port)


def test_no_token_is_refused(daemons) -> None:
    _, port, _ = daemons
    json_only = {"Content-Type": "application/json"}
    code, body = _call(port, "POST", "/v1/jobs", {"epsilon": 1.0}, json_only)
    assert code == 401 and "token" in body["error"]
    wrong = {**json_only, "Authorization": "Bearer not-the-token"}
    assert _call(port, "POST", "/v1/jobs", {"epsilon": 1.0}, wrong)[0] == 401
    # reads that reveal the ledger need it too, on loopback as well (target_party/jobs.py)
    for path in ("/v1/ledger", "/v1/ledger/totals", "/v1/audit", "/metrics"):
        assert _call(port, "GET", path)[0] == 401, path
    assert _call(port, "GET", "/healthz")[0] == 200
    _no_job_started(port)


def test_data_location_cannot_be_overridden(daemons) -> None:
    _, port, token = daemons
    secret = Path(__file__)  # any file the daemon can read
    for body, field in (
        ({"data_path": str(secret)}, "data_path"),
        ({"data_kind": "table", "data_path": str(secret)}, "data_kind"),
        ({"domain": "A"}, "domain"),
        ({"dataset": "other"}, "dataset"),
        ({"no_such_field": 1}, "no_such_field"),
    ):
        code, answer = _call(port, "POST", "/v1/jobs", body, _honest(port, token))
        assert code == 400 and f"job.{field}:" in answer["error"], (body, answer)
    _no_job_started(port)


def test_sizes_are_bounded(daemons) -> None:
    _, port, token = daemons
    for body, field in (
        ({"synthetic_rows": [50_000_000, 50_000_000]}, "synthetic_rows"),
        ({"projection_dim": 1_000_000}, "projection_dim"),
        ({"steps": 10**9}, "steps"),
        ({"batch_size": 10**9}, "batch_size"),
        ({"pate_queries": 10**9}, "pate_queries"),
        ({"pate_teachers": 10**9}, "pate_teachers"),
    ):
        code, answer = _call(port, "POST", "/v1/jobs", body, _honest(port, token))
        assert code == 400 and f"job.{field}" in answer["error"], (body, answer)
    code, answer = _call(port, "POST", "/v1/jobs", b'{"clip_norm": Infinity}', _honest(port, token))
    assert code == 400
    # every invalid field is named, not only the first (issue 14)
    two = {"projection_dim": 1_000_000, "steps": 10**9}
    code, answer = _call(port, "POST", "/v1/jobs", two, _honest(port, token))
    assert code == 400 and {e["field"] for e in answer["errors"]} == {
        "job.projection_dim",
        "job.steps",
    }
    big = json.dumps({"epsilon": 1.0, "pad": "x" * 100_000}).encode()
    code, answer = _call(port, "POST", "/v1/jobs", big, _honest(port, token))
    assert code == 413 and "body" in answer["error"]
    _no_job_started(port)


def test_an_honest_json_post_with_the_token_runs(daemons) -> None:
    _, port, token = daemons
    code, body = _call(port, "POST", "/v1/jobs", {"epsilon": 2.0}, _honest(port, token))
    assert code == 202, body
    deadline = time.monotonic() + 120
    while True:
        view = _call(
            port, "GET", f"/v1/jobs/{body['id']}", headers={"Authorization": f"Bearer {token}"}
        )[1]
        if view["state"] in ("done", "failed") or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert view["state"] == "done", view
    assert 0 < view["results"]["epsilon_spent"] <= 2.0


def test_the_token_file_is_reused_only_if_private(tmp_path: Path) -> None:
    dep = synthetic_deployment(tmp_path)
    cfg = load_target(dep.target_config)
    cfg.state_dir.mkdir(parents=True)
    token, path, generated = admin_token(cfg)
    assert generated and path == cfg.state_dir / "admin_token"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert admin_token(cfg) == (token, path, False)  # a restart reuses it
    path.chmod(0o644)
    with pytest.raises(ConfigError, match="group or others"):
        admin_token(cfg)
    path.unlink()
    (tmp_path / "elsewhere").write_text("x" * 40)
    path.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError, match="not a regular file"):
        admin_token(cfg)


def test_an_admin_token_under_128_bits_is_refused(tmp_path: Path) -> None:
    """A 3-character token (or 40 times one letter) is refused, in the configured token_file
    and in the state directory's own file; a random 32-digit hex token (128 bits) is not."""
    import secrets

    dep = synthetic_deployment(tmp_path)
    cfg = load_target(dep.target_config)
    cfg.state_dir.mkdir(parents=True)
    token_file = tmp_path / "token"
    token_file.touch(mode=0o600)  # a token file others may read is refused before its strength
    for weak in ("abc", "a" * 40):
        token_file.write_text(weak + "\n")
        configured = cfg.model_copy(
            update={"admin": cfg.admin.model_copy(update={"token_file": token_file})}
        )
        with pytest.raises(ConfigError, match="admin.token_file: the admin token is too weak"):
            admin_token(configured)
    strong = secrets.token_hex(16)
    token_file.write_text(strong + "\n")
    configured = cfg.model_copy(
        update={"admin": cfg.admin.model_copy(update={"token_file": token_file})}
    )
    assert admin_token(configured)[0] == strong
    own = cfg.state_dir / "admin_token"
    fd = os.open(own, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, b"0123456789abcdef\n")  # 16 characters: accepted by the old length check
    os.close(fd)
    with pytest.raises(ConfigError, match="too weak"):
        admin_token(cfg)
