"""``dpda bench load``: concurrent honest target sessions and PATE queries against one source
daemon, with a hostile client flooding it in parallel.

* **The source** is ``dpda source serve`` as a separate process (mTLS, SQLite ledger, audit log,
  its default limits), serving a synthetic dataset whose policy allows the attribute unit, row
  releases and PATE. The dataset cap is the largest the config accepts (ε = 100) and the peer
  and target caps are 1e6, with a per-release ε small enough that the honest sessions of a
  five-minute run stay far below them: this measures load, not budget exhaustion.
* **Honest clients** (``--sessions`` threads, spread over ``--peers`` pinned target
  organizations, by default one each) each run ``honest_session`` in a loop until the duration
  ends: open a session (signed terms, the target's PCA basis), release its minibatches one by
  one, ask the PATE teachers a few batches of queries, close. Each client is the target's own
  ``GrpcReleaseSource`` with its own ledger copy and audit log, so every release is verified,
  appended and countersigned as in ``dpda target run``. With many sessions on one dataset the
  ledger head moves between a client's sync and its request; the source then refuses
  (FAILED_PRECONDITION: sync first, or countersign first) and the client syncs and asks again:
  protocol behaviour, counted as ``retries``, not as errors. An OVERLOADED answer (UNAVAILABLE)
  is retried with backoff by the client and counted likewise. An **error** is an honest
  operation that ends in any other failure, or that is still refused after
  ``OP_PATIENCE_S`` seconds of retries.
* **The hostile client** runs in a process of its own with a certificate from the same CA that
  the source has not pinned: multi-MB ``OpenSession`` messages, health ``Watch`` streams,
  garbage bytes to every method, and a fresh TLS connection per request on one thread.
* **Measured**: the latency of every honest RPC that succeeded (at the channel, below the
  client's own audit log; refusals are counted, not timed) and of every honest operation (its
  RPCs plus the client's verification, syncs and retries); the source's peak RSS (``VmHWM``,
  with ``VmRSS`` sampled throughout); the refusals the source counted; CPU seconds per
  process; and, after the run, ``dpda ledger verify`` of the source's state.

The honest clients are ``load_honest``'s, the hostile patterns ``hostile``'s, the result dict
and summary ``load_report``'s; this module deploys the source and runs the benchmark.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from dpda.service.output import add_json_option, write_json
from tests.bench.hostile import merge_counts, spawn_flood, spawn_pattern
from tests.bench.load_honest import (
    DATASET,
    DATASET_CAP,
    DELTA,
    OP_PATIENCE_S,
    PEER_CAP,
    POLICY,
    SOURCE_ROWS,
    Peer,
    Recorder,
    Workload,
    honest_client,
    honest_worker,
    target_view,
)
from tests.bench.load_report import load_result, print_summary


def _deploy(workdir: Path, n_peers: int, extra: tuple[str, ...] = ()) -> tuple[Any, list[Peer]]:
    """The source's config (one synthetic dataset, ``n_peers`` pinned target organizations from
    one CA, then the pinned organizations named in ``extra``) and their keys."""
    from dpda.deployment import _table, make_deployment
    from dpda.service.tls import init_party

    dataset = {
        "name": DATASET,
        "kind": "synthetic",
        "synthetic_rows": [SOURCE_ROWS, 500],
        "epsilon": DATASET_CAP,
        "delta": DELTA,
        "policy": POLICY,
    }
    job = {"dataset": DATASET, "data_kind": "synthetic", "epsilon": 1.0, "delta": DELTA}
    dep = make_deployment(
        workdir,
        dataset=dataset,
        job=job,
        peer_cap=PEER_CAP,
        target_privacy={"disclosures": "exact"},
    )
    peers = [Peer("target-org", dep.target_keys)]
    tables = ""
    names = [f"target-org-{i}" for i in range(2, n_peers + 1)] + list(extra)
    for name in names:
        keys = init_party(workdir / "keys", name, ca_dir=workdir / "keys" / "ca")
        peers.append(Peer(name, keys))
        tables += _table(
            "peers",
            {
                "name": name,
                "cert_fingerprint": keys.fingerprint,
                "signing_public_key": keys.signing_pub,
                "epsilon_cap": PEER_CAP,
            },
            array=True,
        )
    if tables:  # make_deployment's last table is [[peers]]: more of them may follow
        with dep.source_config.open("a") as fh:
            fh.write(tables)
    return dep, peers


def _read_status_kb(pid: int, field_name: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field_name + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


class RssSampler(threading.Thread):
    def __init__(self, pid: int, every_s: float = 0.25) -> None:
        super().__init__(name="rss-sampler", daemon=True)
        self.pid = pid
        self.every_s = every_s
        self.samples: list[int] = []  # kB
        self.stop = threading.Event()

    def run(self) -> None:
        while not self.stop.is_set():
            kb = _read_status_kb(self.pid, "VmRSS")
            if kb is not None:
                self.samples.append(kb)
            self.stop.wait(self.every_s)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def _rusage_s(who: int) -> float:
    import resource

    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def _source_refusals(state_dir: Path) -> dict[str, float]:
    """``dpda_refusals_total`` by code from the source's admin API (loopback)."""
    try:
        port = int((state_dir / "admin_port").read_text())
        token = (state_dir / "admin_token").read_text().strip()  # metrics are behind it
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/metrics", headers={"Authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(req, timeout=10) as r:
            text = r.read().decode()
    except (OSError, ValueError):
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("dpda_refusals_total{"):
            labels, value = line.rsplit(" ", 1)
            code = labels.split('code="', 1)[1].split('"', 1)[0]
            out[code] = out.get(code, 0.0) + float(value)
    return out


# ------------------------------------------------------------------------------- the run
def run_load(
    duration: float,
    sessions: int,
    peers: int = 0,
    workdir: Path | None = None,
    work: Workload | None = None,
    hostile: bool | tuple[str, ...] = True,
    hostile_nice: int = 10,
) -> dict[str, Any]:
    """The whole benchmark; returns the result dict (``REQUIRED_KEYS`` and more). ``hostile``:
    the patterns of ``bench.hostile`` to run beside the honest clients (True: the flood)."""
    from tests.bench.hostile import UNPINNED

    patterns = ("flood",) if hostile is True else () if hostile is False else tuple(hostile)
    pinned_hostile = any(p not in UNPINNED for p in patterns)

    from dpda.deployment import SourceProcess
    from dpda.service.verify import verify_ledger

    work = work or Workload()
    n_peers = max(1, min(peers or sessions, sessions))
    keep = workdir is not None
    root = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="dpda-load-"))
    root.mkdir(parents=True, exist_ok=True)
    dep, peer_keys = _deploy(root, n_peers, ("mallory-pinned",) if pinned_hostile else ())
    mallory_pinned = peer_keys.pop() if pinned_hostile else None
    basis, queries = target_view(work.projection_dim)
    rec = Recorder()
    src = SourceProcess(dep)
    address = f"127.0.0.1:{src.port}"
    # the clients' own log lines (backoff notices) go to a file, not over the summary
    tlog = logging.getLogger("dpda.target")
    handler = logging.FileHandler(root / "clients.log")
    handler.setFormatter(logging.Formatter("%(asctime)s %(threadName)s %(message)s"))
    saved = tlog.propagate
    tlog.addHandler(handler)
    tlog.propagate = False
    sampler = RssSampler(src.proc.pid)
    sampler.start()
    hostile_out = root / "hostile.json"
    proc = None
    procs: list[Any] = []
    try:
        rss_start_kb = _read_status_kb(src.proc.pid, "VmRSS") or 0
        cpu0 = (_cpu_s(src.proc.pid), _rusage_s(0), _rusage_s(-1))  # source, self, children
        load0 = os.getloadavg()[0]
        t_start = time.monotonic()
        deadline = t_start + duration
        if "flood" in patterns:
            proc = spawn_flood(root, dep, address, duration, hostile_out, hostile_nice)
        for pattern in patterns:
            if pattern != "flood":
                procs.append(spawn_pattern(pattern, root, dep, mallory_pinned, address, duration))
        workers = []
        for i in range(sessions):
            peer = peer_keys[i % n_peers]

            def make(i: int = i, peer: Peer = peer) -> Any:
                return honest_client(root, i, peer, dep, address, rec)

            t = threading.Thread(
                target=honest_worker,
                args=(make, work, basis, queries, rec, deadline, 1000 + i),
                name=f"honest-{i}",
                daemon=True,
            )
            t.start()
            workers.append(t)
        for t in workers:
            t.join(timeout=max(0.0, deadline - time.monotonic()) + OP_PATIENCE_S + 60)
        stuck = sum(t.is_alive() for t in workers)
        wall = time.monotonic() - t_start
        for p in ([proc] if proc is not None else []) + procs:
            p.join(timeout=60)
            if p.is_alive():
                p.terminate()
                p.join(timeout=10)
        peak_kb = _read_status_kb(src.proc.pid, "VmHWM") or 0
        cpu = {
            "source": round(_cpu_s(src.proc.pid) - cpu0[0], 1),
            "honest_clients": round(_rusage_s(0) - cpu0[1], 1),
            "hostile_client": round(_rusage_s(-1) - cpu0[2], 1),
            "cores": os.cpu_count(),
            "loadavg_1min": [round(load0, 2), round(os.getloadavg()[0], 2)],  # start, end
        }
        rss_end_kb = _read_status_kb(src.proc.pid, "VmRSS") or 0
        refusals = _source_refusals(dep.source_state)
    finally:
        sampler.stop.set()
        sampler.join(timeout=5)
        src.stop()
        for p in ([proc] if proc is not None else []) + procs:
            if p.is_alive():
                p.kill()
        tlog.removeHandler(handler)
        tlog.propagate = saved
        handler.close()
    problems, warnings, entries = verify_ledger(str(dep.source_state))
    last_spend = _last_spend(dep.source_state)
    flood = merge_counts([hostile_out, *(root / f"hostile-{p}.json" for p in patterns)])
    out = load_result(
        rec,
        sampler,
        flood,
        duration=duration,
        sessions=sessions,
        peers=n_peers,
        wall=wall,
        stuck=stuck,
        peak_kb=peak_kb,
        rss_kb=(rss_start_kb, rss_end_kb),
        cpu=cpu,
        refusals=refusals,
        ledger=(problems, warnings, entries, last_spend),
        work=work,
        hostile_nice=hostile_nice if patterns else None,
    )
    out["hostile_patterns"] = list(patterns)
    out["hostile_by_pattern"] = {
        p: int(sum(merge_counts([root / f"hostile-{p}.json"])["codes"].values()))
        for p in patterns
        if p != "flood"
    }
    out["workdir"] = str(root) if keep else None
    if not keep:
        shutil.rmtree(root, ignore_errors=True)
    return out


def _last_spend(state_dir: Path) -> float:
    import sqlite3

    db = state_dir / "state.sqlite"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        row = conn.execute(
            "SELECT entry_json FROM ledger WHERE dataset=? ORDER BY seq DESC LIMIT 1", (DATASET,)
        ).fetchone()
    finally:
        conn.close()
    return float(json.loads(row[0])["spend_after"]) if row else 0.0


def run_bench_load(args: argparse.Namespace) -> int:
    from tests.bench.hostile import parse_patterns

    out = run_load(
        args.duration,
        args.sessions,
        peers=args.peers,
        workdir=Path(args.workdir) if args.workdir else None,
        work=Workload(steps=args.steps, pate_calls=args.pate_calls, pate_batch=args.pate_batch),
        hostile=() if args.no_hostile else parse_patterns(args.hostile),
        hostile_nice=args.hostile_nice,
    )
    print_summary(out)
    write_json(args, out)
    return 0 if out["errors"] == 0 and not out["ledger"]["verify_problems"] else 1


def register_load(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser(
        "load",
        help="concurrent honest sessions + PATE against one source daemon, with a hostile "
        "client flooding it: errors, latency percentiles, the source's peak RSS",
    )
    s.add_argument("--duration", type=float, default=300.0, metavar="S", help="seconds (300)")
    s.add_argument("--sessions", type=int, default=16, metavar="N", help="concurrent sessions")
    s.add_argument(
        "--peers",
        type=int,
        default=0,
        help="pinned target organizations the sessions are spread over (0: one per session)",
    )
    s.add_argument("--steps", type=int, default=4, help="minibatch releases per session")
    s.add_argument("--pate-calls", type=int, default=2, help="QueryTeachers calls per session")
    s.add_argument("--pate-batch", type=int, default=10, help="queries per call")
    s.add_argument("--no-hostile", action="store_true", help="no hostile client")
    s.add_argument(
        "--hostile",
        default="flood",
        metavar="PATTERNS",
        help="hostile patterns beside the honest clients, comma-separated, or all, or none: "
        "flood (an unpinned certificate's flood), bytes (concurrent 31 MiB messages from an "
        "unpinned certificate), hint (a pinned peer's planned-terms hints with the longest "
        "plan allowed), pate (a pinned peer's 100,000-query PATE requests). Default: flood",
    )
    s.add_argument(
        "--hostile-nice",
        type=int,
        default=10,
        help="CPU niceness of the hostile client's process (0: the same priority as the rest)",
    )
    s.add_argument("--workdir", default=None, help="keep the deployment and state here")
    add_json_option(s)
    s.set_defaults(func=run_bench_load)
