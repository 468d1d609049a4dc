"""The target's per-batch fits as Dask tasks (issue 18), on a real ``LocalCluster`` of worker
processes: results independent of the number of workers, a worker SIGKILLed mid-job costing a
recomputation and never a new release or charge, no n × m array in the job's own process, and
batches split to fit a worker's memory. The release source is the in-process ``SourceReleaser``
(the one ``dpda simulate`` runs) behind a real in-memory ledger, wrapped to count requests."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

pytest.importorskip("distributed")

from dpda.data.synthetic import two_domains
from dpda.dp import rng as dp_rng  # (a `test…` name would be collected)
from dpda.dp.ledger import Budget, MemoryLedgerStore, PrivacyLedger
from dpda.dp.mechanisms import PrivacyUnit
from dpda.policy import PrivacyPolicy
from dpda.protocol import BatchRelease
from dpda.source_party.releases import SourceReleaser
from dpda.target_party.compute import Compute, ComputeSpec, open_compute
from dpda.target_party.pipeline import DPDAResult, run_dpda
from dpda.target_party.view import AdaptConfig, target_view
from dpda.terms import SessionTerms

STEPS = 6
TERMS = SessionTerms(
    dataset="synthetic",
    epsilon=8.0,
    delta=1.0 / 3600,
    projection_dim=10,
    batch_size=500,
    steps=STEPS,
    max_steps=STEPS,
    privacy_unit=PrivacyUnit.ATTRIBUTE,  # row releases: one plan of batch × target rows each
)
CFG = AdaptConfig(select="none", classifier="logistic")


class CountingSource:
    """The in-process source, counting what the job asks of it; ``on_release(i)`` runs after
    release ``i`` arrived (the kill test's trigger)."""

    def __init__(self, inner: SourceReleaser, on_release: Any = None) -> None:
        self.inner = inner
        self.releases: list[int] = []
        self.on_release = on_release

    def open_session(self, *a: Any, **kw: Any) -> Any:
        return self.inner.open_session(*a, **kw)

    def release(self, session_id: str, index: int) -> BatchRelease:
        rel = self.inner.release(session_id, index)
        self.releases.append(index)
        if self.on_release is not None:
            self.on_release(index)
        return rel

    def query_teachers(self, *a: Any, **kw: Any) -> Any:
        return self.inner.query_teachers(*a, **kw)

    def close_session(self, session_id: str) -> None:
        self.inner.close_session(session_id)


@dataclass
class Run:
    result: DPDAResult
    releases: list[int]
    ledger: list[Any]


@pytest.fixture(scope="module")
def data():
    return two_domains(3000, 2000, k=32, seed=0)


def _run(
    data, compute: Compute, on_release: Any = None, terms: SessionTerms = TERMS, cfg=None
) -> Run:
    src, tgt = data
    view = target_view(tgt, "raw")
    rng, public = dp_rng.testing_streams(0)
    store = MemoryLedgerStore()
    ledger = PrivacyLedger(store, {terms.dataset: Budget(terms.epsilon, terms.delta)})
    policy = PrivacyPolicy.rehearsal(terms.privacy_unit, terms.release, 1.0)
    releaser = SourceReleaser(
        src, terms.dataset, ledger, rng, "raw", policy=policy, public=public, insecure_seed=True
    )
    source = CountingSource(releaser, on_release)
    res = run_dpda(
        source,  # type: ignore[arg-type]
        view,
        terms,
        CFG if cfg is None else cfg,
        lambda: ledger.spent(terms.dataset),
        compute=compute,
    )
    return Run(res, source.releases, store.entries(terms.dataset))


def _same(a: Run, b: Run) -> None:
    ra, rb = a.result, b.result
    assert np.array_equal(ra.predictions, rb.predictions)
    assert np.array_equal(ra.mapped, rb.mapped)  # bit for bit, not approximately
    assert ra.accuracy == rb.accuracy
    assert ra.w_tilde == rb.w_tilde
    assert ra.epsilon_spent == rb.epsilon_spent
    assert ra.batch_spend == rb.batch_spend
    assert a.releases == b.releases == list(range(STEPS))
    # the same charges of the same releases (each entry's digest of what was released)
    charged = [[(e.dp_event, e.spend_after, e.payload_sha256) for e in r.ledger] for r in (a, b)]
    assert charged[0] == charged[1]
    assert len(a.ledger) == len(b.ledger) == STEPS


@pytest.fixture(scope="module")
def one_worker(data) -> Run:
    with open_compute(ComputeSpec("local", workers=1)) as compute:
        assert compute.workers == 1
        return _run(data, compute)


def test_dask_local_cluster_refuses_a_client_without_the_jobs_credentials():
    """A local user who finds the scheduler's port connects as an ordinary Dask client: over
    plain TCP, and over TLS with a certificate of its own CA, it never reaches the scheduler
    (so runs no code in the workers); the cluster listens on loopback and has no dashboard."""
    from distributed import Client
    from distributed.security import Security

    with open_compute(ComputeSpec("local", workers=1)) as compute:
        addr = compute.client.scheduler.address
        host_port = addr.split("://", 1)[1]
        assert addr.startswith("tls://127.0.0.1:")
        http_port = compute.client.scheduler_info()["services"]["dashboard"]
        conn = http.client.HTTPConnection("127.0.0.1", http_port, timeout=10)
        conn.request("GET", "/json/identity.json")  # no page about the job or its workers
        status = conn.getresponse().status
        conn.close()
        assert status == 404
        with pytest.raises(OSError):  # loopback only
            socket.create_connection((_outward_address(), http_port), timeout=3).close()
        # the workers' HTTP servers: a health check, no /metrics about the job's tasks
        for worker in compute.client.scheduler_info()["workers"].values():
            port = worker["services"]["dashboard"]
            for path, expect in (("/metrics", 404), ("/health", 200)):
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
                conn.request("GET", path)
                assert conn.getresponse().status == expect, path
                conn.close()
        assert compute.client.submit(_square, 3).result() == 9  # the job's own client works
        for attempt in (
            lambda: Client(f"tcp://{host_port}", timeout=3),
            lambda: Client(f"tls://{host_port}", timeout=3, security=Security.temporary()),
        ):
            with pytest.raises((OSError, TimeoutError)):
                intruder = attempt()
                intruder.run_on_scheduler(lambda: os.getpid())  # pragma: no cover - the attack
                intruder.close()  # pragma: no cover


def _outward_address() -> str:
    """This machine's address on its default route (not loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.connect(("192.0.2.1", 9))  # no packet is sent
        return str(s.getsockname()[0])


def _square(x: int) -> int:
    return x * x


def test_dask_results_do_not_depend_on_worker_count(data, one_worker):
    with open_compute(ComputeSpec("local", workers=2)) as compute:
        assert compute.workers == 2
        two = _run(data, compute)
    _same(one_worker, two)
    assert one_worker.result.accuracy is not None and one_worker.result.accuracy > 0.6


def _fit_keys(client: Any) -> dict[str, list[str]]:
    """Each worker's finished fits held in memory (the tasks' keys, not scattered data)."""
    return {
        w: [k for k in keys if str(k).startswith("_limited-")]
        for w, keys in client.has_what().items()
    }


def test_dask_worker_killed_mid_job_costs_a_retry_not_a_release(data, one_worker):
    killed: dict[str, Any] = {}
    with open_compute(ComputeSpec("local", workers=2)) as compute:
        client = compute.client  # type: ignore[attr-defined]

        def kill_a_worker(index: int) -> None:
            if index != 3:
                return
            # a worker that holds a finished fit: its result is lost with it and must be
            # recomputed from the task (the job has not gathered anything yet)
            deadline = time.monotonic() + 60
            while True:
                held = {w: k for w, k in _fit_keys(client).items() if k}
                if held or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert held, "no fit finished within 60 s"
            worker, keys = next(iter(held.items()))
            pid = client.run(os.getpid, workers=[worker])[worker]
            os.kill(pid, signal.SIGKILL)
            killed.update(worker=worker, pid=pid, keys=keys)

        run = _run(data, compute, kill_a_worker)
        assert killed, "the kill never happened"
        # the killed worker's results were computed twice: on it, then again elsewhere
        story = client.run_on_scheduler(
            lambda dask_scheduler: [
                (t[0], t[2]) for t in dask_scheduler.transition_log if t[0] in killed["keys"]
            ]
        )
        pids = set(client.run(os.getpid).values())
    assert killed["pid"] not in pids
    for key in killed["keys"]:
        assert sum(1 for k, finish in story if k == key and finish == "memory") >= 2, key
    # the same job, the same releases asked once each, the same ledger
    _same(one_worker, run)


def _arrays(x: Any) -> list[np.ndarray]:
    if isinstance(x, np.ndarray):
        return [x]
    if hasattr(x, "__dataclass_fields__"):
        return [a for f in x.__dataclass_fields__ for a in _arrays(getattr(x, f))]
    return []


@pytest.mark.soak  # two jobs or more: CI runs it after the README's test command (-m soak)
def test_dask_job_process_never_holds_a_plan():
    """tracemalloc sees every NumPy buffer of this process: in-process, the peak is at least one
    batch's plan (batch × target rows); with Dask, the job process stays far below it."""
    from dataclasses import replace

    data = two_domains(3000, 6000, k=16, seed=1)
    terms = TERMS.model_copy(update={"batch_size": 1000, "steps": 3, "max_steps": 3})
    # the plans only: the label-free choice's scores read a fixed sample of rows (a few MB,
    # whatever the plan's size), which is not what this measures
    cfg = replace(CFG, keep="dpda")
    n, m = terms.batch_size, data[1].x.shape[0]
    plan_bytes = 4 * n * m  # one float32 plan: 24 MB here
    peaks = {}
    for name, spec in (("inprocess", ComputeSpec()), ("dask", ComputeSpec("local", workers=2))):
        with open_compute(spec) as compute:
            tracemalloc.start()
            try:
                run = _run(data, compute, terms=terms, cfg=cfg)
                peaks[name] = tracemalloc.get_traced_memory()[1]
            finally:
                tracemalloc.stop()
        assert run.releases == [0, 1, 2]
        # nothing of a plan's size came back either
        assert all(a.size < n * m / 4 for a in _arrays(run.result))
    assert peaks["inprocess"] > plan_bytes, peaks  # the measure sees a plan when there is one
    assert peaks["dask"] < plan_bytes / 2, peaks


@pytest.mark.soak  # two jobs or more: CI runs it after the README's test command (-m soak)
def test_dask_batches_split_to_fit_a_worker(data, one_worker):
    """A worker memory that holds a quarter of a batch's plan: each release is fitted in pieces
    (the same pieces on 1 or 2 workers), the job completes at the same cost, and the split is
    said to change the result (smaller transport problems)."""
    from dpda.target_party.compute import BYTES_PER_CELL, WORKER_SHARE

    m = data[1].x.shape[0]
    memory = int(TERMS.batch_size * m * BYTES_PER_CELL / WORKER_SHARE / 4)
    runs = []
    for workers in (1, 2):
        with open_compute(ComputeSpec("local", workers=workers)) as compute:
            compute.memory_per_worker = memory
            cells = compute.max_cells()
            assert cells is not None and cells < TERMS.batch_size * m  # it must split
            runs.append(_run(data, compute))
    a, b = runs
    assert np.array_equal(a.result.mapped, b.result.mapped)
    assert a.result.mapped.shape == one_worker.result.mapped.shape
    assert a.result.epsilon_spent == one_worker.result.epsilon_spent
    assert a.releases == list(range(STEPS))
    assert not np.array_equal(a.result.mapped, one_worker.result.mapped)


@pytest.mark.soak  # a benchmark's short run: CI runs it after the README's test command (-m soak)
def test_dask_bench_scale_writes_its_rows(tmp_path):
    """``dpda bench scale`` on a tiny shape: one row per worker count with the contract's keys,
    the same batches and accuracy on 1 and 2 workers (fits independent of the worker count)."""
    import json

    from dpda.cli.main import main

    out = tmp_path / "scale.json"
    args = ["--n-source", "2000", "--n-target", "1000", "--dim", "16", "--batch-size", "200"]
    assert main(["bench", "scale", *args, "--steps", "3", "--json", str(out)]) == 0
    got = json.loads(out.read_text())
    assert got["complete"] is True
    rows = got["rows"]
    assert [r["workers"] for r in rows] == [1, 2]
    for r in rows:
        assert r["seconds"] > 0 and r["batches"] == 3 and r["fit_tasks"] == 3
        assert 0 < r["per_batch_seconds"] <= r["seconds"]
    assert rows[0]["accuracy"] == rows[1]["accuracy"]
    assert rows[0]["efficiency"] == 1.0 and rows[1]["efficiency"] > 0


def test_dask_service_job_equals_simulate_on_dask(tmp_path):
    """The real pair of daemons (mTLS, SQLite ledgers, countersignatures) with the target's
    ``[compute]`` on a 2-worker LocalCluster gives the predictions of ``dpda simulate`` with its
    fits on a 1-worker LocalCluster (λ selection on: the grid's re-fits run on Dask too), with
    one ledger entry per release on both sides."""
    import hashlib

    from dpda.deployment import set_source_address
    from dpda.service.config import load_source, load_target
    from dpda.simulation import simulate
    from dpda.source_party.app import run_server
    from dpda.target_party.app import open_state, run

    from .helpers import DELTA
    from .helpers import synthetic_deployment as deployment

    dep = deployment(tmp_path, seed=123, job={"batch_size": 150, "steps": 3}, attribute_unit=True)
    with dep.target_config.open("a") as f:
        f.write('\n[compute]\nscheduler = "local"\nworkers = 2\n')
    with run_server(load_source(dep.source_config)) as rs:
        set_source_address(dep, f"127.0.0.1:{rs.port}")
        out = run(load_target(dep.target_config), progress=False)
        source_entries = rs.handlers.ledger.store.entries("synthetic")
    target_ledger, _ = open_state(load_target(dep.target_config))
    assert len(source_entries) == len(target_ledger.store.entries("synthetic")) == 3
    src, tgt = two_domains()
    terms = SessionTerms(
        dataset="synthetic",
        epsilon=4.0,
        delta=DELTA,
        projection_dim=10,
        batch_size=150,
        steps=3,
        noise_multiplier=0.0,
        privacy_unit="attribute",
    )
    with open_compute(ComputeSpec("local", workers=1)) as compute:
        sim = simulate(src, tgt, terms, "raw", AdaptConfig(), 123, baselines=False, compute=compute)
    assert out["compute"].startswith("dask tls://127.0.0.1:") and "(2 workers)" in out["compute"]
    assert out["selection"]["method"] == "circular"
    assert out["accuracy"] == sim.dpda.accuracy and out["w_tilde"] == sim.dpda.w_tilde
    assert out["predictions_sha256"] == hashlib.sha256(sim.dpda.predictions.tobytes()).hexdigest()
