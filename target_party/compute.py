"""Where the target's per-batch fits run: in the job's own process (the default) or
as Dask tasks on a ``LocalCluster`` or an existing Dask cluster.

A Dask client runs arbitrary code in the workers, so the cluster must know who connects: the
local cluster speaks TLS with a CA and certificates made for the job (in memory, never on disk),
listens on loopback and has no dashboard; an existing cluster is reached over ``tls://`` with
the job's certificate, or over plain ``tcp://`` only where the config says
``allow_unauthenticated_scheduler`` (``dpda.service.config.ComputeConfig`` checks that).

The job's process alone talks to the source: it pulls the releases in order and makes every
ledger call where it always did (``dpda.target_party.pipeline._release_all``). What it hands to
a ``Compute`` is post-processing only — a release's points and the target's own rows — so a
worker that dies costs a recomputation of its tasks, never a new release or charge. The target's
rows are sent to the workers once per session (``put``), not per task.

``dask`` is imported only when a Dask engine is opened: daemons without it run the in-process
engine, which is the same code with one worker (``submit`` runs the task at once).
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from dpda.errors import ConfigError
from dpda.service.config import ComputeConfig

# Peak bytes of one fit (cost, kernel, plan and the solver's work arrays) per plan entry
# (source points × target rows), rounded up from docs/results.md#past-one-machine.
BYTES_PER_CELL = 16
# the share of a worker's memory one fit may take: Dask starts spilling at 60% of the limit and
# pauses the worker at 80%, and a worker also holds the target's rows and finished results
WORKER_SHARE = 0.5
# BLAS/OpenMP thread counts the workers start with (one per Dask thread: the ratio of 1 and 2
# workers then measures scaling, not a BLAS pool fighting the other workers for cores)
BLAS_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
# what the local scheduler's and workers' HTTP servers answer: their health check, nothing about
# the job (a worker's /metrics names its tasks and their sizes, for any local user to read)
SCHEDULER_HTTP_ROUTES = ["distributed.http.health"]
WORKER_HTTP_ROUTES = ["distributed.http.health"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b)?\s*$", re.IGNORECASE)


def parse_bytes(text: str | int, field: str = "compute.memory_per_worker") -> int:
    """``"4GiB"``, ``"512MB"``, ``"2g"`` or a number of bytes → bytes (powers of 1024)."""
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE.match(text)
        if m is None:
            raise ConfigError(f"{field}: {text!r} is not a size (e.g. 4GiB, 512MiB)")
        value = int(float(m.group(1)) * 1024 ** "bkmgt".index((m.group(2) or "b").lower()))
    if value < 64 * 2**20:
        raise ConfigError(f"{field}: {value} bytes is less than 64 MiB, too little for a worker")
    return value


@dataclass(frozen=True)
class ComputeSpec:
    """What ``[compute]`` asks for (``dpda.service.config.ComputeConfig`` validates it)."""

    scheduler: str = "inprocess"  # inprocess | local | tls://host:8786 | tcp://host:8786
    workers: int = 1  # local: worker processes
    memory_per_worker: int | None = None  # bytes; None: no split (in-process) / Dask's default
    threads_per_worker: int = 1
    tls: tuple[str, str, str] | None = None  # tls://: (CA file, client cert, client key)


class Pending:
    """A task already run in this process (the in-process engine)."""

    def __init__(self, value: Any) -> None:
        self.value = value


class Compute:
    """The in-process engine: every task runs when it is submitted, in this process."""

    workers = 1
    memory_per_worker: int | None = None

    def __init__(self, memory_per_worker: int | None = None) -> None:
        self.memory_per_worker = memory_per_worker

    def put(self, obj: Any) -> Any:
        """A handle on ``obj`` that tasks take as an argument (sent to the workers once)."""
        return obj

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        return Pending(fn(*args))

    def gather(self, pending: list[Any]) -> list[Any]:
        return [p.value for p in pending]

    def handle(self, pending: Any) -> Any:
        """What a later task takes as an argument for ``pending``'s result: the value itself
        here; on Dask the future (the later task then waits for it)."""
        return pending.value

    def derive(self, fn: Callable[[Any], Any], pending: Any) -> Any:
        """``fn`` of ``pending``'s result, as a pending result of its own (a small task, not a
        fit: on Dask it is not held to the fits' BLAS limit and keeps its own name)."""
        return Pending(fn(pending.value))

    def max_cells(self) -> int | None:
        """Plan entries one task may hold in a worker's memory (None: no limit)."""
        if self.memory_per_worker is None:
            return None
        return max(1, int(self.memory_per_worker * WORKER_SHARE) // BYTES_PER_CELL)

    def describe(self) -> str:
        return "in-process"


def _identity(obj: Any) -> Any:
    return obj


def _limited(threads: int, fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` with the BLAS pools held to ``threads`` (on a worker of any cluster)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=threads):
        return fn(*args)


class DaskCompute(Compute):
    """Tasks as Dask futures on ``client``'s cluster."""

    def __init__(self, client: Any, memory_per_worker: int | None, threads: int = 1) -> None:
        super().__init__(memory_per_worker)
        self.client = client
        self.threads = threads
        self.workers = max(1, len(client.scheduler_info(n_workers=-1)["workers"]))

    def put(self, obj: Any) -> Any:
        # A task that returns ``obj``, not a scatter: scattered data has no recipe, so once the
        # workers holding it die (or Dask's memory manager has dropped the other replicas) every
        # fit that needs it is cancelled; a task's result is recomputed from the copy in its
        # spec. It is then copied to every worker once, as a broadcast scatter would be.
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Sending large graph")
            fut = self.client.submit(_identity, obj, pure=False)
        self.client.replicate([fut])
        return fut

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        # pure=False: a fresh key per task (two grid points never share a result by accident);
        # a lost result is recomputed from the task, whose arguments the scheduler keeps
        return self.client.submit(_limited, self.threads, fn, *args, pure=False)

    def handle(self, pending: Any) -> Any:
        return pending

    def derive(self, fn: Callable[[Any], Any], pending: Any) -> Any:
        return self.client.submit(fn, pending, pure=False)

    def gather(self, pending: list[Any]) -> list[Any]:
        out = self.client.gather(pending)
        for f in pending:
            f.release()
        return list(out)

    def describe(self) -> str:
        return f"dask {self.client.scheduler.address} ({self.workers} workers)"


def blas_env(threads: int) -> dict[str, str]:
    return {k: str(threads) for k in BLAS_ENV}


def spec_of(cfg: ComputeConfig) -> ComputeSpec:
    """The ``[compute]`` table of a target's config as a ``ComputeSpec``."""
    memory = None
    if cfg.memory_per_worker is not None:
        memory = parse_bytes(cfg.memory_per_worker)
    tls = None
    if cfg.tls_ca_file is not None and cfg.tls_cert is not None and cfg.tls_key is not None:
        tls = (str(cfg.tls_ca_file), str(cfg.tls_cert), str(cfg.tls_key))
    return ComputeSpec(cfg.scheduler, cfg.workers, memory, cfg.threads_per_worker, tls)


@contextmanager
def open_compute(spec: ComputeSpec) -> Iterator[Compute]:
    """The engine ``spec`` names, closed (cluster and client) on exit."""
    if spec.scheduler == "inprocess":
        yield Compute(spec.memory_per_worker)
        return
    try:
        import dask
        from distributed import Client, LocalCluster
    except ImportError as exc:  # pragma: no cover - dask is a dependency; a slim image may lack it
        raise ConfigError(
            f"compute.scheduler: {spec.scheduler!r} needs dask[distributed] installed"
        ) from exc
    if spec.scheduler == "local":
        from distributed.security import Security

        # TLS with a CA and certificates made for this job alone (held in memory): a local
        # user who finds the port cannot connect, and with no client certificate cannot run
        # code in the workers; loopback only, and no dashboard
        security = Security.temporary()
        # The scheduler's HTTP server starts even without a dashboard: on loopback, at any free
        # port, with the health check alone (no task/worker pages, no proxy to the workers);
        # so do the workers' (no /metrics: the nannies hand this config to their workers).
        routes = {
            "distributed.scheduler.http.routes": SCHEDULER_HTTP_ROUTES,
            "distributed.worker.http.routes": WORKER_HTTP_ROUTES,
        }
        with dask.config.set(routes):
            cluster = LocalCluster(
                n_workers=spec.workers,
                threads_per_worker=spec.threads_per_worker,
                processes=True,
                protocol="tls://",
                host="127.0.0.1",
                security=security,
                memory_limit=spec.memory_per_worker if spec.memory_per_worker else "auto",
                dashboard_address="127.0.0.1:0",
                scheduler_kwargs={"dashboard": False},
                env=blas_env(spec.threads_per_worker),
            )
        try:
            with Client(cluster, security=security) as client:
                yield DaskCompute(client, _worker_memory(client, spec), spec.threads_per_worker)
        finally:
            cluster.close()
        return
    if spec.scheduler.startswith("tls://"):
        from distributed.security import Security

        if spec.tls is None:
            raise ConfigError("compute.tls_ca_file: required with a tls:// scheduler")
        ca, cert, key = spec.tls
        security = Security(
            tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True
        )
        with Client(spec.scheduler, security=security) as client:
            yield DaskCompute(client, _worker_memory(client, spec), spec.threads_per_worker)
        return
    if not spec.scheduler.startswith("tcp://"):
        raise ConfigError(
            f"compute.scheduler: {spec.scheduler!r} is not inprocess, local, tls:// or tcp://"
        )
    with Client(spec.scheduler) as client:
        yield DaskCompute(client, _worker_memory(client, spec), spec.threads_per_worker)


def _worker_memory(client: Any, spec: ComputeSpec) -> int | None:
    """The memory a fit must fit in: the configured figure, else the smallest worker's limit."""
    if spec.memory_per_worker is not None:
        return spec.memory_per_worker
    limits = [
        w.get("memory_limit") or 0 for w in client.scheduler_info(n_workers=-1)["workers"].values()
    ]
    known = [x for x in limits if x > 0]
    return min(known) if known else None


def split_rows(n: int, m: int, max_cells: int | None) -> list[tuple[int, int]]:
    """Contiguous spans of ``n`` source points such that each span × ``m`` target rows holds at
    most ``max_cells`` plan entries (one span when it already does, or without a limit)."""
    if max_cells is None or n * m <= max_cells or n <= 1:
        return [(0, n)]
    k = min(n, math.ceil(n * m / max_cells))
    bounds = [round(i * n / k) for i in range(k + 1)]
    return [(bounds[i], bounds[i + 1]) for i in range(k) if bounds[i + 1] > bounds[i]]
