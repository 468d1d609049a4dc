"""SIGKILL fault trials against real daemon processes (used by the tests and the soak command).

Each trial starts the source daemon and a target job as separate processes, SIGKILLs one of them
at a random point of the release stream (after a random number of durable ledger entries plus a
random delay), restarts, lets the job resume, and checks the invariants:

* never a payload without a durable ledger entry whose hash matches it;
* never a double charge: one ledger entry per request id, exactly ``steps`` per session;
* after the job finishes, the two ledgers are identical, entry for entry, both signatures set.
"""

from __future__ import annotations

import hashlib
import random
import sqlite3
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from common.deployment import Deployment, SourceProcess, dpda_command, run_target

STEPS = 12


@dataclass
class TrialResult:
    killed: str
    kill_after_entries: int
    entries_at_kill: int
    payloads_at_kill: int
    resumed_live: bool = False


def _ledger_rows(db: Path) -> list[tuple[str, int, str]]:
    import json

    if not db.is_file():
        return []
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        rows = conn.execute("SELECT dataset, seq, entry_json FROM ledger ORDER BY dataset, seq")
        out = [(d, s, json.loads(j)) for d, s, j in rows.fetchall()]
    except sqlite3.OperationalError:
        out = []
    finally:
        conn.close()
    return out


def check_source_invariants(state: Path) -> tuple[int, int]:
    """(entries, payloads); raises AssertionError on any violated invariant."""
    db = state / "state.sqlite"
    entries = _ledger_rows(db)
    rids = [e["request_id"] for _, _, e in entries]
    assert len(rids) == len(set(rids)), "double charge: a request id has two ledger entries"
    by_key = {(d, s): e for d, s, e in entries}
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        payloads = conn.execute("SELECT dataset, seq, z, counts FROM payloads").fetchall()
    finally:
        conn.close()
    for d, s, z, c in payloads:
        e = by_key.get((d, s))
        assert e is not None, "a payload exists without a durable ledger entry"
        assert e["payload_sha256"] == hashlib.sha256(z + c).hexdigest(), "payload hash mismatch"
    return len(entries), len(payloads)


def _retarget(dep: Deployment, state: Path) -> None:
    text = dep.target_config.read_text().splitlines()
    text = [f'state_dir = "{state}"' if ln.startswith("state_dir") else ln for ln in text]
    dep.target_config.write_text("\n".join(text) + "\n")


def _set_listen(dep: Deployment, port: int) -> None:
    lines = dep.source_config.read_text().splitlines()
    lines = [f'listen = "127.0.0.1:{port}"' if ln.startswith("listen") else ln for ln in lines]
    dep.source_config.write_text("\n".join(lines) + "\n")


def _start_target(dep: Deployment, log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        return subprocess.Popen(
            dpda_command("target", "run", "--config", str(dep.target_config), "--quiet"),
            stdout=fh,
            stderr=subprocess.STDOUT,
        )


def _wait_entries(db: Path, n: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(_ledger_rows(db)) < n and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.005)


def run_trial(dep: Deployment, trial: int, rng: random.Random, kill: str) -> TrialResult:
    state = dep.workdir / f"target-{trial}"
    _retarget(dep, state)
    src_db = dep.source_state / "state.sqlite"
    base = len(_ledger_rows(src_db))
    k = rng.randrange(0, STEPS)
    src = SourceProcess(dep)
    tgt = _start_target(dep, dep.workdir / f"target-{trial}.log")
    _wait_entries(
        src_db if kill == "source" else state / "state.sqlite",
        (base if kill == "source" else 0) + k,
        tgt,
    )
    time.sleep(rng.uniform(0, 0.03))
    victim = src.proc if kill == "source" else tgt
    victim.kill()  # SIGKILL
    victim.wait()
    entries, payloads = check_source_invariants(dep.source_state)
    resumed_live = False
    if kill == "source":
        # restart on the same state and the same port: the running target reconnects
        _set_listen(dep, src.port)
        src = SourceProcess(dep)
        resumed_live = tgt.wait(timeout=180) == 0
    try:
        if not resumed_live:
            res = run_target(dep, timeout=300)  # resume the job from the target's state
            assert res.returncode == 0, f"resumed job failed: {res.stderr[-2000:]}"
    finally:
        src.stop()
    check_source_invariants(dep.source_state)
    src_rows = [e for _, _, e in _ledger_rows(src_db)]
    tgt_rows = [e for _, _, e in _ledger_rows(state / "state.sqlite")]
    assert src_rows == tgt_rows, "the ledgers do not reconcile"
    assert all(e["source_sig"] and e["target_sig"] for e in tgt_rows if e["payload_sha256"])
    sessions: dict[str, int] = {}
    for e in src_rows:
        sessions[e["session"]] = sessions.get(e["session"], 0) + 1
    assert all(n == STEPS for n in sessions.values()), "a session was charged a wrong count"
    return TrialResult(kill, k, entries, payloads, resumed_live)
