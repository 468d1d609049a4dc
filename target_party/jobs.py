"""``dpda target serve``: the target as a daemon that takes adaptation jobs over its admin API.

``POST /v1/jobs`` (JSON body: overrides of the config's ``[job]`` fields, validated with the
field named on error) starts a job in a background thread — one at a time, a second one while a
job runs gets 409. ``GET /v1/jobs`` lists this daemon's jobs and every finished one in
``state_dir/jobs/`` (a ``dpda target run`` into the same state dir too), and each one listed
answers at ``GET /v1/jobs/{id}`` (state, progress, results) and ``GET /v1/jobs/{id}/report``
(the HTML report with its plots; for a job that failed or has not finished, an HTML page that
says so and why). The admin API also serves the target's
own ledger, audit log and metrics (``dpda.service.admin``).

A job spends the target's budget and sends the source what the target discloses about its data
(the projection basis and column means), so the API is guarded:

* **Token always.** With ``[admin] token_file`` configured, that token; without one, ``serve``
  uses ``state_dir/admin_token``: generated at the first start (32 random bytes, created 0600
  with ``O_EXCL``), reused on later starts only if it is a regular file owned by this user with
  no group or other permission bits, and its path is printed. Every request needs
  ``Authorization: Bearer <token>`` — ``POST /v1/jobs``, every job artefact (``GET /v1/jobs``, a
  job, its report: they describe the target's rows), the ledger, audit log and metrics — except
  ``/healthz``, ``/readyz`` and the API's description (``/openapi.json``, ``/docs``,
  ``/redoc``), which hold no data (``dpda.service.admin.PUBLIC_PATHS``).
* **Host, Origin, JSON only, 64 KiB bodies**: ``dpda.service.admin`` (403, 403, 415, 413).
* **Allow-list of overridable fields** (``OVERRIDABLE``): privacy and algorithm parameters only.
  What names the data — ``dataset``, ``data_kind``, ``data_path``, ``domain`` — comes from the
  config file alone (400 naming the field): a request could otherwise point the daemon at any
  readable file and send its statistics to the source.
* **Bounds** on the fields that size allocations (``synthetic_rows``, ``projection_dim``,
  ``batch_size``, ``steps``, ``pate_queries``, ``pate_teachers``:
  ``dpda.service.config.TargetJob``), finite numbers only (400 naming the field).
"""

from __future__ import annotations

import html
import json
import logging
import signal
import threading
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import HTMLResponse, JSONResponse
from pydantic import BaseModel, ConfigDict, ValidationError, create_model
from starlette.exceptions import HTTPException
from starlette.requests import Request

from dpda.errors import DpdaError, public_message
from dpda.service import settle_heap
from dpda.service.admin import AdminApp, AdminServer, Refusal
from dpda.service.config import TargetConfig, TargetJob
from dpda.service.keyfiles import write_atomic
from dpda.service.metrics import Metrics
from dpda.service.tokens import daemon_token
from dpda.target_party.app import JOBS_DIR, open_state, past_jobs, run_job
from dpda.target_party.own_rows import OWN_ROWS
from dpda.target_party.report import render

log = logging.getLogger("dpda.target")

# job fields a POST may override: privacy and algorithm parameters. Everything else — above all
# what names the data or its location (dataset, data_kind, data_path, domain) — is the config's.
OVERRIDABLE = frozenset(
    {
        "representation",
        "scaling",
        "synthetic_rows",
        "epsilon",
        "delta",
        "privacy_unit",
        "neighbouring",
        "projection",
        "projection_dim",
        "batch_size",
        "steps",
        "noise_multiplier",
        "calibration",
        "clip_norm",
        "reg_e",
        "reg_g",
        "classifier",
        "method",
        "release",
        "pate_share",
        "pate_queries",
        "pate_teachers",
        "pate_aggregator",
        "pate_space",
    }
)


# the body of POST /v1/jobs as the OpenAPI schema shows it: the overridable fields of TargetJob,
# each optional, nothing else
def _optional(name: str) -> Any:
    annotation: Any = TargetJob.model_fields[name].annotation
    return (annotation | None, None)


_Overrides = create_model(
    "JobOverrides",
    __config__=ConfigDict(extra="forbid"),
    **{n: _optional(n) for n in sorted(OVERRIDABLE)},
)


def _inlined(schema: Any, defs: dict[str, Any]) -> Any:
    """``schema`` with every ``{"$ref": "#/$defs/X"}`` replaced by ``X`` itself: pydantic's
    local references mean nothing inside the OpenAPI document, whose viewers then fail."""
    if isinstance(schema, dict):
        ref = schema.get("$ref", "")
        if ref.startswith("#/$defs/"):
            return _inlined(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inlined(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inlined(v, defs) for v in schema]
    return schema


_raw = _Overrides.model_json_schema()
OVERRIDES_SCHEMA = _inlined(_raw, _raw.get("$defs", {}))


class JobStarted(BaseModel):
    id: str
    state: str


class JobView(BaseModel):
    id: str
    state: str
    progress: dict[str, int]
    overrides: dict[str, Any]
    results: dict[str, Any] | None
    error: str | None
    output_dir: str | None = None  # where the job wrote its outputs (its own folder)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number")


def _check_overrides(overrides: dict[str, Any]) -> str | None:
    """The first field (sorted) a request may not set, with why; None when all may be set."""
    for name in sorted(overrides):
        if name not in TargetJob.model_fields:
            return f"job.{_shown(name)}: no such job field"
        if name not in OVERRIDABLE:
            return (
                f"job.{name}: cannot be overridden through the API (what names the data or its "
                "location comes from the config file only)"
            )
    return None


def _shown(name: str) -> str:
    return name if len(name) <= 64 else name[:64] + "…"


def admin_token(cfg: TargetConfig) -> tuple[str, Path, bool]:
    """(token, where it is, whether it was generated): ``tokens.daemon_token``."""
    return daemon_token(cfg.state_dir, cfg.admin.token_file)


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
            "output_dir": (self.results or {}).get("output_dir"),
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
            overrides = json.loads(body or b"{}", parse_constant=_no_constant)
            if not isinstance(overrides, dict):
                raise ValueError
        except (ValueError, RecursionError):
            return 400, {"error": "the body must be a JSON object of job fields"}
        refused = _check_overrides(overrides)
        if refused is not None:
            return 400, {"error": refused}
        try:
            job_cfg = self.cfg.job.with_changes(**overrides)
        except ValidationError as exc:  # every problem, each naming its field
            errors = [
                {
                    "field": "job." + (".".join(str(p) for p in e["loc"]) or "job"),
                    "message": str(e["msg"]),
                }
                for e in exc.errors()
            ]
            text = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
            return 400, {"error": text, "errors": errors}
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
            # every output in the job's own folder, named by its id; never the config's
            # predictions path, which another job (the CLI's) writes too
            own = cfg.model_copy(update={"job": cfg.job.with_changes(predictions=None)})
            job.results, job.figures = run_job(own, progress, job_id=job.id)
            job.state = "done"
            self.metrics.epsilon.labels(cfg.job.dataset, "source").set(job.results["epsilon_spent"])
            if job.results.get("target_epsilon_total") is not None:  # its own rows
                own = job.results["target_epsilon_total"]
                self.metrics.epsilon.labels(OWN_ROWS, "target").set(own)
        except Exception as exc:
            code, _ = public_message(exc)
            job.error = str(exc) if isinstance(exc, DpdaError) else f"{code}: internal error"
            job.state = "failed"
            self.metrics.refusals.labels(code).inc()
            log.error("job %s failed: %s", job.id, traceback.format_exc())
        finally:
            with self.lock:
                self.busy = False

    def router(self) -> APIRouter:
        """The jobs API, added to the admin API (``dpda.service.admin`` checks Host, Origin, JSON,
        size and the token first). ``POST /v1/jobs`` validates its body itself, against the
        allow-list and ``TargetJob``: 400 naming every field that is wrong."""
        r = APIRouter(tags=["jobs"])
        refused = {"model": Refusal, "description": "refused: the error names the field"}

        @r.post(
            "/v1/jobs",
            status_code=202,
            summary="start a job (overrides of the config's [job] fields)",
            response_model=JobStarted,
            responses={400: refused, 409: {"model": Refusal, "description": "a job runs"}},
            openapi_extra={
                "requestBody": {
                    "required": False,
                    "content": {"application/json": {"schema": OVERRIDES_SCHEMA}},
                }
            },
        )
        async def post(request: Request) -> Response:
            code, data = self.start(await request.body())
            return JSONResponse(data, status_code=code)

        @r.get(
            "/v1/jobs",
            response_model=list[JobView],
            summary="every job: this daemon's, and each finished one found on disk (the CLI's)",
        )
        def jobs() -> list[dict[str, Any]]:
            return self.listing()

        @r.get(
            "/v1/jobs/{job_id}",
            response_model=JobView,
            summary="one job: state, progress, results",
            responses={404: {"model": Refusal, "description": "no such job"}},
        )
        def job(job_id: str) -> dict[str, Any]:
            return self._job(job_id).view()

        @r.get(
            "/v1/jobs/{job_id}/report",
            response_class=HTMLResponse,
            summary="the job's HTML report with its plots",
            responses={
                404: {"model": Refusal, "description": "no such job"},
                409: {
                    "content": {"text/html": {}},
                    "description": "the job failed or is not done: a page that says which and why",
                },
            },
        )
        def report(job_id: str) -> HTMLResponse:
            job = self._job(job_id)
            if job.state != "done" or job.results is None:
                return HTMLResponse(not_done_page(job), status_code=409)
            if job.figures is None:  # a job found on disk: the page its run wrote
                page = self._outdir(job_id) / "report.html"
                if page.is_file():
                    return HTMLResponse(page.read_text(encoding="utf-8"))
                return HTMLResponse(render(job.results, {}))
            return HTMLResponse(render(job.results, job.figures))

        return r

    def listing(self) -> list[dict[str, Any]]:
        """The jobs on disk (``state_dir/jobs/<id>/results.json``, oldest first) that this
        daemon did not run, then this daemon's own."""
        done = [
            Job(job_id, {}, state="done", results=results).view()
            for job_id, results in past_jobs(self.cfg)
            if job_id not in self.jobs
        ]
        return done + [j.view() for j in self.jobs.values()]

    def _job(self, job_id: str) -> Job:
        """This daemon's job ``job_id``, else the finished one on disk (404 when neither)."""
        job = self.jobs.get(job_id)
        if job is not None:
            return job
        path = self._outdir(job_id) / "results.json"
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError):
            raise HTTPException(404, "no such job") from None
        return Job(job_id, {}, state="done", results=results)

    def _outdir(self, job_id: str) -> Path:
        if not job_id or not all(c.isalnum() or c in "-_" for c in job_id):
            raise HTTPException(404, "no such job")
        return self.cfg.state_dir / JOBS_DIR / job_id


def not_done_page(job: Job) -> str:
    """The report's place for a job without one: its state and, when it failed, why."""
    state = html.escape(job.state)
    if job.state == "failed":
        why = html.escape(job.error or "no reason was recorded")
        body = (
            f"<p><b>The job failed</b>; it has no report.</p><p>Why: <code>{why}</code></p>"
            "<p>Every charge it made is in the ledger (<code>dpda ledger show STATE_DIR</code>);"
            " the daemon's log has the details.</p>"
        )
    else:
        body = (
            f"<p>The job is <b>{state}</b>: {job.done} of {job.total or '?'} releases done. "
            "Its report comes when it is done; reload this page then.</p>"
        )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>dpda job "
        f"{html.escape(job.id)}: {state}</title><style>body{{font-family:sans-serif;"
        "margin:24px;max-width:1100px}</style></head>"
        f"<body><h1>dpda job {html.escape(job.id)}: {state}</h1>{body}</body></html>"
    )


def serve(cfg: TargetConfig) -> int:
    """Run the target daemon until SIGTERM/SIGINT; writes ``state_dir/admin_port``."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    ledger, audit = open_state(cfg)
    metrics = Metrics()
    runner = JobRunner(cfg, metrics)
    token, token_path, generated = admin_token(cfg)
    app = AdminApp(
        metrics,
        ledger.store.entries,
        lambda: [r for r, _ in audit.records()],
        lambda: True,
        token,
        routers=[runner.router()],
        # every request but health, readiness and the API's description needs the token
        allowed_hosts=cfg.admin.allowed_hosts,
    )
    host, port = cfg.admin.listen.rsplit(":", 1)
    server = AdminServer(app, host.strip("[]"), int(port))
    server.start()
    settle_heap()  # started: what it keeps stays out of the collector's way during jobs
    print(f"dpda target admin API on http://{host}:{server.port} (POST /v1/jobs)", flush=True)
    made = "generated in" if generated else "in"
    print(
        f"admin token {made} {token_path} (send Authorization: Bearer <token> "
        "with Content-Type: application/json to POST /v1/jobs)",
        flush=True,
    )
    # last: whoever waits for this file finds the announcement already written
    write_atomic(cfg.state_dir / "admin_port", str(server.port).encode())
    try:
        stop.wait()
    finally:
        server.stop()
    return 0
