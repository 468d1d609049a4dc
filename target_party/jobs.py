"""``dpda target serve``: the target as a daemon that takes adaptation jobs over its admin API.

``POST /v1/jobs`` (JSON body: overrides of the config's ``[job]`` fields, validated with the
field named on error) starts a job in a background thread — one at a time, a second one while a
job runs gets 409. ``GET /v1/jobs/{id}`` gives state, progress and results; ``GET
/v1/jobs/{id}/report`` the HTML report with its plots. The admin API also serves the target's
own ledger, audit log and metrics (``common.admin``).
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from common.admin import AdminApp, AdminServer, Metrics
from common.config import TargetConfig, TargetJob
from common.errors import DpdaError, public_message

from .app import open_state, run_job
from .report import render

log = logging.getLogger("dpda.target")


@dataclass
class Job:
    id: str
    overrides: dict[str, Any]
    state: str = "queued"  # queued | running | done | failed
    done: int = 0
    total: int = 0
    results: dict[str, Any] | None = None
    figures: dict[str, Any] | None = field(default=None, repr=False)
    error: str | None = None

    def view(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "state": self.state,
            "progress": {"releases_done": self.done, "releases_total": self.total},
            "overrides": self.overrides,
            "results": self.results,
            "error": self.error,
        }


class JobRunner:
    def __init__(self, cfg: TargetConfig, metrics: Metrics) -> None:
        self.cfg = cfg
        self.metrics = metrics
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()
        self.busy = False

    def start(self, body: bytes) -> tuple[int, dict[str, Any]]:
        try:
            overrides = json.loads(body or b"{}")
            if not isinstance(overrides, dict):
                raise ValueError
        except ValueError:
            return 400, {"error": "the body must be a JSON object of job fields"}
        try:
            job_cfg = TargetJob.model_validate({**self.cfg.job.model_dump(), **overrides})
        except ValidationError as exc:
            err = exc.errors()[0]
            name = ".".join(str(p) for p in err["loc"]) or "job"
            return 400, {"error": f"job.{name}: {err['msg']}"}
        with self.lock:
            if self.busy:
                return 409, {"error": "a job is already running"}
            self.busy = True
            job = Job(uuid.uuid4().hex[:12], overrides)
            self.jobs[job.id] = job
        cfg = self.cfg.model_copy(update={"job": job_cfg})
        threading.Thread(target=self._run, args=(job, cfg), daemon=True).start()
        return 202, {"id": job.id, "state": job.state}

    def _run(self, job: Job, cfg: TargetConfig) -> None:
        job.state = "running"

        def progress(done: int, total: int) -> None:
            job.done, job.total = done, total

        try:
            job.results, job.figures = run_job(cfg, progress)
            job.state = "done"
            self.metrics.epsilon.labels(cfg.job.dataset, "source").set(job.results["epsilon_spent"])
        except Exception as exc:  # noqa: BLE001 - reported through the API, logged in full
            code, _ = public_message(exc)
            job.error = str(exc) if isinstance(exc, DpdaError) else f"{code}: internal error"
            job.state = "failed"
            self.metrics.refusals.labels(code).inc()
            log.error("job %s failed: %s", job.id, traceback.format_exc())
        finally:
            with self.lock:
                self.busy = False

    def route(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes] | None:
        def js(code: int, data: Any) -> tuple[int, str, bytes]:
            return code, "application/json", json.dumps(data).encode()

        if path == "/v1/jobs":
            if method == "POST":
                return js(*self.start(body))
            if method == "GET":
                return js(200, [j.view() for j in self.jobs.values()])
            return js(405, {"error": "method not allowed"})
        if not path.startswith("/v1/jobs/"):
            return None
        parts = path.split("/")[3:]
        job = self.jobs.get(parts[0])
        if job is None:
            return js(404, {"error": "no such job"})
        if len(parts) == 1:
            return js(200, job.view())
        if len(parts) == 2 and parts[1] == "report":
            if job.state != "done" or job.results is None or job.figures is None:
                return js(409, {"error": f"the job is {job.state}; the report comes when done"})
            return 200, "text/html; charset=utf-8", render(job.results, job.figures).encode()
        return js(404, {"error": "not found"})


def serve(cfg: TargetConfig) -> int:
    """Run the target daemon until SIGTERM/SIGINT; writes ``state_dir/admin_port``."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ledger, audit = open_state(cfg)
    metrics = Metrics()
    runner = JobRunner(cfg, metrics)
    token = cfg.admin.token_file.read_text().strip() if cfg.admin.token_file else None
    app = AdminApp(
        metrics,
        ledger.store.entries,
        lambda: [r for r, _ in audit.records()],
        lambda: True,
        token,
        extra=runner.route,
    )
    host, port = cfg.admin.listen.rsplit(":", 1)
    server = AdminServer(app, host.strip("[]"), int(port))
    server.start()
    tmp = cfg.state_dir / "admin_port.tmp"
    tmp.write_text(str(server.port))
    tmp.replace(cfg.state_dir / "admin_port")
    print(f"dpda target admin API on http://{host}:{server.port} (POST /v1/jobs)", flush=True)
    try:
        stop.wait()
    finally:
        server.stop()
    return 0
