"""Each job writes its outputs into a folder of its own, named by its id: a job started through
the admin API never writes over the CLI's, and ``GET /v1/jobs`` lists both."""

from __future__ import annotations

import hashlib
import json
import time
import urllib.request
from pathlib import Path

from dpda.deployment import SourceProcess, run_target

from .helpers import start_target_serve, synthetic_deployment


def _get(port: int, path: str, token: str | None = None, body: dict | None = None) -> dict:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data)
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:  # jobs and their artefacts are behind the token, reads too
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.iterdir()}


def test_the_api_job_and_the_cli_job_keep_their_own_outputs(tmp_path: Path) -> None:
    dep = synthetic_deployment(tmp_path, job={"batch_size": 120, "steps": 2}, attribute_unit=True)
    src = SourceProcess(dep)
    try:
        done = run_target(dep, "--json", str(tmp_path / "cli.json"))
        assert done.returncode == 0, done.stderr[-3000:]
        cli = json.loads((tmp_path / "cli.json").read_text())
        cli_dir = Path(cli["output_dir"])
        assert cli_dir == dep.target_state / "jobs" / cli["job_id"]
        assert {"predictions.csv", "model.skops", "results.json", "report.html"} <= set(
            _digests(cli_dir)
        )
        before = _digests(cli_dir)

        tgt, port = start_target_serve(dep, tmp_path / "target.log")
        try:
            token = (dep.target_state / "admin_token").read_text().strip()
            job_id = _get(port, "/v1/jobs", token, {"epsilon": 2.0})["id"]
            deadline = time.monotonic() + 120
            while (view := _get(port, f"/v1/jobs/{job_id}", token))["state"] not in (
                "done",
                "failed",
            ):
                assert time.monotonic() < deadline, view
                time.sleep(0.2)
            assert view["state"] == "done", view
            listed = {j["id"]: j for j in _get(port, "/v1/jobs", token)}
        finally:
            tgt.terminate()
            tgt.wait(timeout=20)
    finally:
        src.stop()
    assert view["output_dir"] == str(dep.target_state / "jobs" / job_id)
    assert set(listed) == {cli["job_id"], job_id}
    assert listed[cli["job_id"]]["state"] == "done"
    assert listed[cli["job_id"]]["output_dir"] == str(cli_dir)
    assert listed[cli["job_id"]]["results"]["predictions_sha256"] == cli["predictions_sha256"]
    assert _digests(cli_dir) == before  # the API's job wrote nothing over the CLI's
