"""SIGKILL fault trials against real daemon processes (used by the tests and the soak run).

Every trial starts the source daemon (``dpda source serve``) and a target job (``dpda target
run``) as separate processes, kills one of them, recovers (restart, live reconnection or a
resumed job) and checks the invariants. Kinds of trial:

* **timed** (``run_trial``): SIGKILL the source or the target at a random moment of the release
  stream (after a random number of durable ledger entries plus a random delay);
* **crash point** (``run_crash_trial``): the victim runs with ``DPDA_CRASH_AT=point@N``
  (``common.crashpoints``) and SIGKILLs itself at that exact protocol step — OpenSession, a
  release between charge/draw, store and sign, a PATE answer, a countersignature;
* **budget** (``run_budget_trial``): the source's dataset cap allows only part of the job; both
  parties are killed on the way; the resumed job must end refused for budget;
* **lost writes** (``run_lost_writes_trial``): while the job runs, the victim's state file is
  copied with SQLite's online backup API each time a transaction commits (every commit is
  fsynced: ``synchronous=FULL``), so each copy is the file as a disk would hold it had it lost
  every write after that commit's fsync. The victim is SIGKILLed, its file replaced by one of
  the copies (``-wal``/``-shm`` removed), and it is restarted.

What a trial asserts on is what it *observed*: the victim's exit status (-9: SIGKILL), the
crash point line the victim wrote before dying, the ledger entries and payloads on both sides at
the kill — never the plan. After recovery (``check_recovered``):

* never a payload without a durable ledger entry whose hash matches it;
* never a double charge: one ledger entry per request id, a session's batches a prefix
  ``0..k-1`` (all ``steps`` of them when the job finished);
* never a release drawn twice: every payload the source's audit log shows leaving, and every one
  the target's shows arriving, has one hash per request id — the ledger's;
* the two ledgers are identical, entry for entry (both signatures set when the job finished).
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sqlite3
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dpda.deployment import Deployment, SourceProcess, dpda_command
from dpda.service.crashpoints import ENV

STEPS = 12
DATASET = "synthetic"
RESTORED = "restored from the peer's countersigned copy"
SENT_BEFORE = "this release was sent before and its stored copy is lost"

# every crash point of common.crashpoints, with the job it needs and the victim
SOURCE_POINTS = [
    "source.open_session.stored",
    "source.release.drawn",
    "source.release.stored",
    "source.release.signed",
    "source.countersign.stored",
    "source.pate.drawn",
    "source.pate.stored",
]
TARGET_POINTS = [
    "target.open_session.received",
    "target.release.appended",
    "target.release.countersigned",
]


@dataclass
class Observed:
    """What a trial saw when its victim died, and how the job ended."""

    victim: str  # "source" | "target"
    returncode: int  # the victim's exit status: -9 when SIGKILLed
    point: str = ""  # the crash point the victim reported ("" for a timed kill)
    new_entries: int = 0  # ledger entries this trial added on the source, at the kill
    payloads: int = 0  # stored payloads (releases + PATE answers) on the source, at the kill
    target_entries: int = 0  # entries in the target's ledger at the kill
    # of those, the ones of this trial's session: the target's copy also holds the dataset's
    # earlier entries (other sessions', synced when the job opened its session)
    target_new: int = 0
    last: dict[str, Any] | None = None  # the source's newest entry at the kill
    outcome: str = ""  # "live" | "resumed" | "refused: ..."
    restored: int = 0  # entries the source took back from the target's copy
    extra: dict[str, Any] = field(default_factory=dict)


# ------------------------------------------------------------------------------- reading state
def _connect_ro(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30, isolation_level=None)


def _ledger_rows(db: Path) -> list[tuple[str, int, dict[str, Any]]]:
    if not db.is_file():
        return []
    conn = _connect_ro(db)
    try:
        rows = conn.execute("SELECT dataset, seq, entry_json FROM ledger ORDER BY dataset, seq")
        out = [(d, s, json.loads(j)) for d, s, j in rows.fetchall()]
    except sqlite3.OperationalError:
        out = []
    finally:
        conn.close()
    return out


def entries(db: Path) -> list[dict[str, Any]]:
    return [e for d, _, e in _ledger_rows(db) if d == DATASET]


def _count(db: Path, table: str) -> int:
    if not db.is_file():
        return 0
    conn = _connect_ro(db)
    try:
        return int(conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0])
    except sqlite3.OperationalError:
        return 0
    finally:
        conn.close()


def _payload_hashes(db: Path) -> dict[tuple[str, int], str]:
    """(dataset, seq) → SHA-256 of every stored payload: releases and PATE answers."""
    conn = _connect_ro(db)
    try:
        rel = conn.execute("SELECT dataset, seq, z, counts FROM payloads").fetchall()
        try:
            pate = conn.execute("SELECT dataset, seq, labels FROM pate_answers").fetchall()
        except sqlite3.OperationalError:
            pate = []
    finally:
        conn.close()
    out = {(d, s): hashlib.sha256(z + c).hexdigest() for d, s, z, c in rel}
    out.update({(d, s): hashlib.sha256(b).hexdigest() for d, s, b in pate})
    return out


def _sent(db: Path) -> dict[str, set[str]]:
    """request id → payload hashes of the releases the log shows leaving (source) or arriving
    (target)."""
    out: dict[str, set[str]] = {}
    if not db.is_file():
        return out
    conn = _connect_ro(db)
    try:
        rows = conn.execute("SELECT record_json FROM audit").fetchall()
    except sqlite3.OperationalError:
        rows = []
    finally:
        conn.close()
    for (text,) in rows:
        r = json.loads(text)
        method = r["method"].rsplit("/", 1)[-1]
        moved = (r["side"] == "source") == (r["direction"] == "out")
        if method in ("ReleaseBatches", "QueryTeachers") and r["ledger_seq"] >= 0 and moved:
            out.setdefault(r["request_id"], set()).add(r["payload_sha256"])
    return out


def check_source_invariants(state: Path) -> tuple[int, int]:
    """(entries, payloads); raises AssertionError on any violated invariant."""
    db = state / "state.sqlite"
    rows = _ledger_rows(db)
    rids = [e["request_id"] for _, _, e in rows]
    assert len(rids) == len(set(rids)), "double charge: a request id has two ledger entries"
    by_key = {(d, s): e for d, s, e in rows}
    payloads = _payload_hashes(db)
    for key, digest in payloads.items():
        e = by_key.get(key)
        assert e is not None, "a payload exists without a durable ledger entry"
        assert e["payload_sha256"] == digest, "payload hash mismatch"
    return len(rows), len(payloads)


def fired(log: Path) -> list[str]:
    """The crash points a process reported in its log (``dpda crash point NAME@N``)."""
    if not log.is_file():
        return []
    prefix = "dpda crash point "
    return [
        ln[len(prefix) :].strip()
        for ln in log.read_text(errors="replace").splitlines()
        if ln.startswith(prefix)
    ]


def check_recovered(dep: Deployment, state: Path, *, finished: bool, steps: int) -> None:
    """The invariants after recovery (see the module docstring)."""
    src_db = dep.source_state / "state.sqlite"
    tgt_db = state / "state.sqlite"
    check_source_invariants(dep.source_state)
    src = entries(src_db)
    tgt = entries(tgt_db)
    assert src == tgt, "the ledgers do not reconcile"
    by_rid = {e["request_id"]: e for e in src}
    sent = _sent(src_db)
    for rid, hashes in _sent(tgt_db).items():
        sent.setdefault(rid, set()).update(hashes)
    for rid, hashes in sent.items():
        assert len(hashes) == 1, f"release {rid} was drawn twice: {len(hashes)} payloads left"
        e = by_rid.get(rid)
        assert e is not None, f"release {rid} left without a durable ledger entry"
        assert e["payload_sha256"] in hashes, f"release {rid} left with another hash"
    batches: dict[str, list[int]] = {}
    for e in src:
        sid, _, rest = e["request_id"].partition("/")
        if not rest.startswith("pate/"):
            batches.setdefault(sid, []).append(int(rest))
    for sid, idx in batches.items():
        assert sorted(idx) == list(range(len(idx))), f"session {sid}: batches are not a prefix"
    if finished:
        assert all(e["source_sig"] and e["target_sig"] for e in tgt if e["payload_sha256"])
        job = [sid for sid in batches if len(batches[sid]) == steps]
        assert job, "no session has all its batches"


# -------------------------------------------------------------------------------- processes
def _retarget(dep: Deployment, state: Path) -> None:
    text = dep.target_config.read_text().splitlines()
    text = [f'state_dir = "{state}"' if ln.startswith("state_dir") else ln for ln in text]
    dep.target_config.write_text("\n".join(text) + "\n")


def _set_line(config: Path, key: str, value: str) -> None:
    lines = config.read_text().splitlines()
    if any(ln.startswith(f"{key} ") for ln in lines):
        lines = [f"{key} = {value}" if ln.startswith(f"{key} ") else ln for ln in lines]
    else:  # before the first table
        i = next(i for i, ln in enumerate(lines) if ln.startswith("["))
        lines.insert(i, f"{key} = {value}")
    config.write_text("\n".join(lines) + "\n")


def _set_listen(dep: Deployment, port: int) -> None:
    _set_line(dep.source_config, "listen", f'"127.0.0.1:{port}"')


def _env(crash: str) -> dict[str, str]:
    return {**os.environ, "PYTHONUNBUFFERED": "1", ENV: crash}


def start_source(dep: Deployment, log: Path, crash: str = "") -> SourceProcess:
    """The source daemon; ``crash``: its ``DPDA_CRASH_AT`` (never set in this process)."""
    return SourceProcess(dep, log, prefix=("env", f"{ENV}={crash}"))


def start_target(dep: Deployment, log: Path, crash: str = "") -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        return subprocess.Popen(
            dpda_command("target", "run", "--config", str(dep.target_config), "--quiet"),
            stdout=fh,
            stderr=subprocess.STDOUT,
            env=_env(crash),
        )


def run_target(dep: Deployment, log: Path, timeout: float = 300) -> int:
    """A resumed job to its end; its output is appended to ``log``."""
    proc = start_target(dep, log)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def _wait(cond: Callable[[], bool], proc: subprocess.Popen, timeout: float, tick=None) -> None:
    """Until ``cond()``, ``proc`` ends or ``timeout``; ``tick`` runs at every poll."""
    deadline = time.monotonic() + timeout
    while not cond() and proc.poll() is None and time.monotonic() < deadline:
        if tick is not None:
            tick()
        time.sleep(0.005)


def _observe(dep: Deployment, state: Path, victim: str, rc: int, base: int) -> Observed:
    src_db = dep.source_state / "state.sqlite"
    src = entries(src_db)
    return Observed(
        victim=victim,
        returncode=rc,
        new_entries=len(src) - base,
        payloads=len(_payload_hashes(src_db)),
        target_entries=len(entries(state / "state.sqlite")),
        target_new=sum(e["session"] == session for e in entries(state / "state.sqlite"))
        if (session := _session_of(state))
        else 0,
        last=src[-1] if len(src) > base else None,
    )


def _of_session(rows: list[dict[str, Any]], state: Path) -> list[dict[str, Any]]:
    """The entries of the session the target at ``state`` opened (its copy, and the source's,
    also hold earlier trials' sessions)."""
    sid = _session_of(state)
    return [e for e in rows if e["session"] == sid]


def _session_of(state: Path) -> str:
    """The session the target's job opened (``job.json``; "" before it opened one)."""
    job = state / "job.json"
    try:
        return str(json.loads(job.read_text())["session_id"])
    except (OSError, ValueError, KeyError):
        return ""


def _log_tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:] if log.is_file() else ""


# ----------------------------------------------------------------------------- timed kills
def run_trial(dep: Deployment, trial: int, rng: random.Random, kill: str) -> Observed:
    """SIGKILL ``kill`` at a random moment of the stream; restart; resume; check."""
    state = dep.workdir / f"target-{trial}"
    _retarget(dep, state)
    src_db = dep.source_state / "state.sqlite"
    base = len(entries(src_db))
    k = rng.randrange(0, STEPS)
    src_log, tgt_log = dep.workdir / f"source-{trial}.log", dep.workdir / f"target-{trial}.log"
    src = start_source(dep, src_log)
    tgt = start_target(dep, tgt_log)
    if kill == "source":
        _wait(lambda: _count(src_db, "ledger") >= base + k, tgt, 60)
    else:  # this session's entries in the target's copy (it also holds the earlier trials')
        tgt_db = state / "state.sqlite"
        _wait(
            lambda: sum(e["session"] == _session_of(state) for e in entries(tgt_db)) >= k, tgt, 60
        )
    time.sleep(rng.uniform(0, 0.03))
    victim = src.proc if kill == "source" else tgt
    victim.kill()  # SIGKILL
    obs = _observe(dep, state, kill, victim.wait(), base)
    assert obs.returncode == -9 or kill == "target", f"the source ended {obs.returncode}"
    check_source_invariants(dep.source_state)
    rc = None
    if kill == "source":
        # restart on the same state and the same port: the running target reconnects
        _set_listen(dep, src.port)
        src = start_source(dep, src_log)
        rc = tgt.wait(timeout=180)
        obs.outcome = "live" if rc == 0 else ""
    try:
        if rc != 0:
            rc = run_target(dep, tgt_log)  # resume the job from the target's state
            assert rc == 0, f"resumed job failed: {_log_tail(tgt_log)}"
            obs.outcome = "resumed"
    finally:
        src.stop()
    check_recovered(dep, state, finished=True, steps=STEPS)
    return obs


# ----------------------------------------------------------------------------- crash points
def _expect_at_kill(point: str, obs: Observed, dep: Deployment, state: Path, nth: int) -> None:
    """What must be observed when ``point`` fired for the ``nth`` time (a mismatch means the
    point is not where its name says)."""
    last = obs.last
    if point == "source.open_session.stored":
        assert obs.new_entries == 0 and not (state / "job.json").exists()
    elif point == "target.open_session.received":
        assert obs.new_entries == 0 and not (state / "job.json").exists()
    elif point.startswith("source.release.") or point.startswith("source.pate."):
        assert last is not None
        pate = "/pate/" in last["request_id"]
        assert pate == point.startswith("source.pate."), last["request_id"]
        stored = (DATASET, last["seq"]) in _payload_hashes(dep.source_state / "state.sqlite")
        assert stored == (not point.endswith(".drawn")), "payload stored (or not) as named"
        assert bool(last["source_sig"]) == point.endswith(".signed"), "signed (or not) as named"
        assert not last["target_sig"] and obs.target_new < obs.new_entries
        if not pate:
            assert last["request_id"].endswith(f"/{nth - 1}") and obs.new_entries == nth
    elif point == "source.countersign.stored":
        assert last is not None and obs.new_entries == nth and last["target_sig"]
    elif point == "target.release.appended":
        tgt = _of_session(entries(state / "state.sqlite"), state)
        assert len(tgt) == nth and not tgt[-1]["target_sig"]
    elif point == "target.release.countersigned":
        tgt = _of_session(entries(state / "state.sqlite"), state)
        assert len(tgt) == nth and tgt[-1]["target_sig"]
        assert _of_session(entries(dep.source_state / "state.sqlite"), state)[nth - 1]["target_sig"]
    else:
        raise AssertionError(f"unknown crash point {point}")


def truncate_source(db: Path, keep: int) -> None:
    """The source loses every ledger entry from ``keep`` on, with its payloads (as a lost WAL
    tail would)."""
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        for table in ("ledger", "payloads", "pate_answers"):
            conn.execute(f"DELETE FROM {table} WHERE dataset=? AND seq>=?", (DATASET, keep))
    finally:
        conn.close()


def rewind_to_draw(db: Path, seq: int) -> None:
    """The source's file as it stood right after release ``seq`` was charged and drawn (its
    payload hash recorded): the later commits — its payload, its signatures, every later
    entry — lost."""
    truncate_source(db, seq + 1)
    conn = sqlite3.connect(db, isolation_level=None)
    try:
        (text,) = conn.execute(
            "SELECT entry_json FROM ledger WHERE dataset=? AND seq=?", (DATASET, seq)
        ).fetchone()
        e = json.loads(text)
        e["source_sig"] = e["target_sig"] = ""
        conn.execute(
            "UPDATE ledger SET entry_json=? WHERE dataset=? AND seq=?",
            (json.dumps(e, sort_keys=True), DATASET, seq),
        )
        conn.execute("DELETE FROM payloads WHERE dataset=? AND seq=?", (DATASET, seq))
    finally:
        conn.close()


def run_crash_trial(
    dep: Deployment,
    trial: int,
    point: str,
    nth: int,
    steps: int = STEPS,
    lose_from: int | None = None,
    rewind_to: int | None = None,
    give_up: bool = False,
) -> Observed:
    """The victim kills itself at ``point@nth``; the other party stays up; recover; check.
    ``lose_from``: the dead source also loses this trial's entries from that one on;
    ``rewind_to``: … its file goes back to just after that release's draw (``rewind_to_draw``);
    ``give_up``: the target stops retrying while the source is down, and the job is resumed."""
    victim = point.split(".", 1)[0]
    state = dep.workdir / f"target-{trial}"
    _retarget(dep, state)
    src_db = dep.source_state / "state.sqlite"
    base = len(entries(src_db))
    src_log, tgt_log = dep.workdir / f"source-{trial}.log", dep.workdir / f"target-{trial}.log"
    spec = f"{point}@{nth}"
    _set_line(dep.target_config, "reconnect_s", "2.0" if give_up else "60.0")
    src = start_source(dep, src_log, spec if victim == "source" else "")
    tgt = start_target(dep, tgt_log, spec if victim == "target" else "")
    try:
        proc = src.proc if victim == "source" else tgt
        rc = proc.wait(timeout=180)
        log = src_log if victim == "source" else tgt_log
        obs = _observe(dep, state, victim, rc, base)
        obs.point = (fired(log) or [""])[-1]
        assert rc == -9, f"the {victim} ended {rc}, not by SIGKILL: {_log_tail(log)}"
        assert obs.point == spec, f"the {victim} died at {obs.point!r}, not {spec}"
        _expect_at_kill(point, obs, dep, state, nth)
        check_source_invariants(dep.source_state)
        if give_up:
            assert tgt.wait(timeout=120) != 0, "the target finished without its source"
        if lose_from is not None:
            truncate_source(src_db, base + lose_from)
        if rewind_to is not None:
            rewind_to_draw(src_db, base + rewind_to)
        if victim == "source":
            _set_listen(dep, src.port)
            src = start_source(dep, src_log)
            rc = tgt.wait(timeout=180)
            obs.outcome = "live"
            if rc != 0:
                obs.outcome = "resumed"
                rc = run_target(dep, tgt_log)
        else:
            obs.outcome = "resumed"
            rc = run_target(dep, tgt_log)
        assert rc == 0, f"the job did not finish after the crash: {_log_tail(tgt_log)}"
        obs.restored = src_log.read_text(errors="replace").count(RESTORED)
    finally:
        if tgt.poll() is None:
            tgt.kill()
            tgt.wait()
        src.stop()
    check_recovered(dep, state, finished=True, steps=steps)
    return obs


# ---------------------------------------------------------------------------------- budget
def run_budget_trial(dep: Deployment, trial: int, rng: random.Random, cap: float) -> Observed:
    """The dataset cap ``cap`` allows only part of the job. The source dies at a release, the
    target at a later countersignature; the job is resumed and must end refused for budget:
    the source's spend ≤ cap, nothing charged twice, both ledgers equal; asked once more, it is
    refused again and nothing more is charged."""
    state = dep.workdir / f"target-{trial}"
    _retarget(dep, state)
    src_db = dep.source_state / "state.sqlite"
    base = len(entries(src_db))
    src_log, tgt_log = dep.workdir / f"source-{trial}.log", dep.workdir / f"target-{trial}.log"
    a = rng.randint(1, 3)
    b = a + rng.randint(1, 2)
    src = start_source(dep, src_log, f"source.release.stored@{a}")
    tgt = start_target(dep, tgt_log, f"target.release.countersigned@{b}")
    try:
        assert src.proc.wait(timeout=180) == -9 and fired(src_log) == [f"source.release.stored@{a}"]
        obs = _observe(dep, state, "source", -9, base)
        obs.point = f"source.release.stored@{a}"
        _set_listen(dep, src.port)
        src = start_source(dep, src_log)
        rc = tgt.wait(timeout=180)
        assert rc == -9 and fired(tgt_log) == [f"target.release.countersigned@{b}"], rc
        obs.extra["target_kill_entries"] = len(entries(state / "state.sqlite"))
        rc = run_target(dep, tgt_log)
        text = _log_tail(tgt_log)
        assert rc != 0, "the job finished beyond the dataset's cap"
        assert "budget" in text.lower(), f"not refused for budget: {text}"
        obs.outcome = "refused: " + text.strip().splitlines()[-1][:120]
        before = entries(src_db)
        assert run_target(dep, tgt_log) != 0  # asked again: refused again, nothing charged
        assert entries(src_db) == before
    finally:
        if tgt.poll() is None:
            tgt.kill()
            tgt.wait()
        src.stop()
    check_recovered(dep, state, finished=False, steps=STEPS)
    src = entries(src_db)
    assert src and max(e["spend_after"] for e in src) <= cap + 1e-9, "spent beyond the cap"
    obs.extra["charged"] = len(src) - base
    obs.extra["spent"] = src[-1]["spend_after"]
    assert 0 < len(src) - base < STEPS, "the cap was not reached inside the job"
    return obs


# ------------------------------------------------------------------------------ lost writes
class Snapshots:
    """Copies of a live SQLite state file, one each time a transaction has committed (every
    commit is fsynced: a copy is the file as it stood on disk right after one fsync). Uses
    SQLite's online backup API from a read-only connection: each copy is consistent."""

    def __init__(self, db: Path, into: Path) -> None:
        self.db = db
        self.into = into
        into.mkdir(parents=True, exist_ok=True)
        self.conn: sqlite3.Connection | None = None
        self.version = -1
        self.copies: list[tuple[int, Path]] = []  # (ledger entries in the copy, file)

    def poll(self) -> None:
        if self.conn is None:
            if not self.db.is_file():
                return
            self.conn = _connect_ro(self.db)
        try:
            (version,) = self.conn.execute("PRAGMA data_version").fetchone()
            if version == self.version:
                return
            self.version = version
            path = self.into / f"{len(self.copies):04d}.sqlite"
            dst = sqlite3.connect(path)
            try:
                self.conn.backup(dst)
            finally:
                dst.close()
        except sqlite3.OperationalError:  # the schema not there yet, or the file busy
            return
        self.copies.append((len(entries(path)), path))

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def restore(self, copy: Path) -> None:
        """The state file loses every write after ``copy``'s commit."""
        self.close()
        for suffix in ("-wal", "-shm"):
            Path(f"{self.db}{suffix}").unlink(missing_ok=True)
        shutil.copyfile(copy, self.db)


def run_lost_writes_trial(
    dep: Deployment, trial: int, rng: random.Random, case: str, earliest: bool = False
) -> Observed:
    """The victim loses every write after one of its commits (a copy taken while the job ran),
    after a SIGKILL at a random moment of the stream. Cases:

    * ``source-live``: the source; the target stays up and reconnects to the restarted source;
      on its next contact it sees the shorter ledger and sends back its countersigned copy;
    * ``source-resumed``: the source; the target gives up while it is down (a short
      ``reconnect_s``) and the job is resumed later. A restored release whose payload the
      source lost cannot be sent again: the resumed job must then fail with that error, and
      draw nothing again; it finishes if the copy still holds every payload the target had;
    * ``target``: the target loses its tail; the resumed job syncs it back from the source and
      gets the stored payloads again, uncharged.

    ``earliest``: restore the earliest copy holding one of this trial's entries (the longest
    lost tail) rather than a random one."""
    victim = case.split("-")[0]
    state = dep.workdir / f"target-{trial}"
    _retarget(dep, state)
    _set_line(dep.target_config, "reconnect_s", "2.0" if case == "source-resumed" else "60.0")
    src_db = dep.source_state / "state.sqlite"
    tgt_db = state / "state.sqlite"
    base = len(entries(src_db))
    src_log, tgt_log = dep.workdir / f"source-{trial}.log", dep.workdir / f"target-{trial}.log"
    snaps = Snapshots(src_db if victim == "source" else tgt_db, dep.workdir / f"copies-{trial}")
    k = rng.randrange(2, STEPS)
    src = start_source(dep, src_log)
    tgt = start_target(dep, tgt_log)
    held: list[dict[str, Any]] = []
    try:
        if victim == "source":
            _wait(lambda: _count(src_db, "ledger") >= base + k, tgt, 60, snaps.poll)
        else:
            _wait(lambda: _count(tgt_db, "ledger") >= k, tgt, 60, snaps.poll)
        end = time.monotonic() + rng.uniform(0, 0.03)
        while time.monotonic() < end:
            snaps.poll()
        snaps.poll()
        proc = src.proc if victim == "source" else tgt
        proc.kill()  # SIGKILL
        obs = _observe(dep, state, victim, proc.wait(), base)
        obs.point = "timed"
        floor = base + 1 if victim == "source" else 0
        eligible = [(n, p) for n, p in snaps.copies if n >= floor]
        assert eligible, "no copy of the state file was taken while the job ran"
        n_copy, copy = eligible[0] if earliest else rng.choice(eligible)
        obs.extra.update(copy_entries=n_copy - (base if victim == "source" else 0))
        obs.extra.update(copies=len(snaps.copies), at_kill=obs.new_entries)
        if victim == "target":
            obs.extra["at_kill"] = obs.target_entries
        if case == "source-resumed":
            rc = tgt.wait(timeout=120)  # the target gives up on its own: its state is settled
            assert rc != 0, "the target finished without its source"
            held = entries(tgt_db)[base:]
            obs.extra["target_entries"] = len(held)
        snaps.restore(copy)
        if victim == "source":
            _set_listen(dep, src.port)
            src = start_source(dep, src_log)
            rc = tgt.wait(timeout=180) if case == "source-live" else run_target(dep, tgt_log)
        else:
            rc = run_target(dep, tgt_log)
        text = _log_tail(tgt_log)
        obs.restored = src_log.read_text(errors="replace").count(RESTORED)
        # did the source lose a payload that had reached the target?
        payload_lost = case == "source-resumed" and not _copy_has_payloads(copy, held)
        if rc == 0:
            obs.outcome = "live" if case == "source-live" else "resumed"
        else:
            obs.outcome = "refused: " + text.strip().splitlines()[-1][:160]
        if payload_lost:  # the job cannot finish, and must say so (the reason: in the log)
            assert rc != 0 and "LEDGER_CORRUPT" in text, f"expected a clean refusal: {text}"
            assert SENT_BEFORE in src_log.read_text(errors="replace")
        else:
            assert rc == 0, f"the job did not finish after the lost writes: {text}"
    finally:
        snaps.close()
        if tgt.poll() is None:
            tgt.kill()
            tgt.wait()
        src.stop()
    check_recovered(dep, state, finished=obs.outcome in ("live", "resumed"), steps=STEPS)
    return obs


def _copy_has_payloads(copy: Path, held: list[dict[str, Any]]) -> bool:
    """Whether the copy still stores the payload of every release the target held."""
    have = _payload_hashes(copy)
    return all((DATASET, e["seq"]) in have for e in held if e["source_sig"])
