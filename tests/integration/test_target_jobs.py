"""``dpda target serve``: jobs over the admin API, progress, results and the HTML report."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request

import pytest

from dpda.deployment import SourceProcess

from .helpers import start_target_serve, synthetic_deployment

_TOKEN: dict[int, str] = {}  # admin port → the token ``serve`` generated in its state_dir


def _req(port: int, path: str, body: dict | None = None, token: bool = True) -> tuple[int, bytes]:
    """A GET, or a POST of JSON, with the daemon's bearer token (``token=False``: without)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method="POST" if body is not None else "GET"
    )
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {_TOKEN[port]}")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


@pytest.fixture
def daemons(tmp_path):
    dep = synthetic_deployment(tmp_path, job={"batch_size": 120, "steps": 4}, attribute_unit=True)
    src = SourceProcess(dep)
    tgt, port = start_target_serve(dep, tmp_path / "target.log")
    _TOKEN[port] = (dep.target_state / "admin_token").read_text().strip()
    try:
        yield dep, port
    finally:
        tgt.terminate()
        tgt.wait(timeout=20)
        src.stop()


def _wait_done(port: int, job_id: str) -> dict:
    deadline = time.monotonic() + 120
    while True:
        view = json.loads(_req(port, f"/v1/jobs/{job_id}")[1])
        if view["state"] in ("done", "failed") or time.monotonic() > deadline:
            return view
        time.sleep(0.2)


def test_jobs_api_and_report(daemons, tmp_path) -> None:
    dep, port = daemons
    assert _req(port, "/v1/jobs", {"epsilon": -1})[0] == 400  # invalid field, named
    assert b"job.epsilon" in _req(port, "/v1/jobs", {"epsilon": -1})[1]
    code, body = _req(port, "/v1/jobs", {"epsilon": 3.0})
    assert code == 202
    job_id = json.loads(body)["id"]
    view = _wait_done(port, job_id)
    assert view["state"] == "done", view
    assert view["progress"] == {"releases_done": 4, "releases_total": 4}
    assert 0 < view["results"]["epsilon_spent"] <= 3.0 and view["results"]["accuracy"] > 50
    # the job's artefacts describe the target's rows: none is served without the token
    for path in ("/v1/jobs", f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/report"):
        assert _req(port, path, token=False)[0] == 401
    # nor the ledger, audit log or metrics; health, readiness and the API's description are open
    for path in ("/metrics", "/v1/ledger", "/v1/audit"):
        assert _req(port, path, token=False)[0] == 401, path
    for path in ("/healthz", "/readyz", "/openapi.json", "/docs", "/redoc"):
        assert _req(port, path, token=False)[0] == 200, path
    assert _req(port, "/metrics", token=False)[0] == 401  # metrics name peers and spend
    assert _req(port, "/metrics")[0] == 200
    code, page = _req(port, f"/v1/jobs/{job_id}/report")
    assert code == 200
    html = page.decode()
    assert html.count("<svg") == 3 and "this job&#x27;s ε after each release" in html
    assert "Accuracy on the target" in html
    ledger = json.loads(_req(port, "/v1/ledger")[1])
    assert len(ledger) == 4 and all(e["target_sig"] for e in ledger)
    (tmp_path / "report.html").write_text(html)
    _screenshot_if_chromium(tmp_path / "report.html", tmp_path / "report.png")


def test_every_listed_job_answers_and_a_failed_jobs_report_says_why(daemons, tmp_path) -> None:
    """A job that ``dpda target run`` ran into the daemon's state dir is listed and its URLs
    work; a job that failed has a report page (HTML) that says why."""
    from dpda.deployment import run_target

    dep, port = daemons
    done = run_target(dep, "--json", str(tmp_path / "cli.json"))
    assert done.returncode == 0, done.stderr[-3000:]
    cli_id = json.loads((tmp_path / "cli.json").read_text())["job_id"]
    listed = json.loads(_req(port, "/v1/jobs")[1])
    assert [j["id"] for j in listed] == [cli_id] and listed[0]["state"] == "done"
    code, body = _req(port, f"/v1/jobs/{cli_id}")
    assert code == 200 and json.loads(body)["results"]["job_id"] == cli_id
    code, page = _req(port, f"/v1/jobs/{cli_id}/report")
    assert code == 200 and page.decode().count("<svg") == 3 and cli_id in page.decode()
    assert _req(port, "/v1/jobs/nope")[0] == 404
    assert _req(port, "/v1/jobs/..%2F..%2Fetc/report")[0] == 404
    # a job on a δ the source does not publish: the source refuses it, in the job's thread
    code, body = _req(port, "/v1/jobs", {"delta": 0.001})
    assert code == 202, body
    failed = json.loads(body)["id"]
    view = _wait_done(port, failed)
    assert view["state"] == "failed" and view["error"], view
    code, page = _req(port, f"/v1/jobs/{failed}/report")
    text = page.decode()
    assert code == 409 and text.startswith("<!doctype html>") and "failed" in text
    assert view["error"].split(":")[0] in text  # the reason, on the page
    assert {j["id"] for j in json.loads(_req(port, "/v1/jobs")[1])} == {cli_id, failed}


def _shoot(browser: str, page, png) -> None:
    subprocess.run(
        [
            browser,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={png.parent / 'chrome'}",
            f"--screenshot={png}",
            "--window-size=1200,1400",
            f"file://{page}",
        ],
        capture_output=True,
        timeout=120,
        env={**os.environ, "HOME": str(png.parent)},
    )


def _screenshot_if_chromium(page, png) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        return  # the page checks above still ran; a browser is optional on CI machines
    _shoot(browser, page, png)
    blank_page = page.parent / "blank.html"
    blank_page.write_text("<!doctype html><html><body></body></html>")
    blank = png.parent / "blank.png"
    _shoot(browser, blank_page, blank)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # not blank: the rendered report (text, three plots) compresses far worse than an empty page
    assert png.stat().st_size > 10 * blank.stat().st_size, (
        png.stat().st_size,
        blank.stat().st_size,
    )
