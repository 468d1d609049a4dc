"""``dpda ledger verify S --against T`` and ``T --against S`` after a clean job in which the
target disclosed its statistics under its own DP: both say OK (the target's own-rows entries,
which the source never holds, are not a lost tail), a lost tail is still caught, and a
read-only copy of a state dir is verified (or the error says why), without a traceback."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest

from dpda.deployment import dpda_command, set_source_address
from dpda.service.config import load_source, load_target
from dpda.source_party.app import run_server
from dpda.target_party.app import run

from .helpers import synthetic_deployment

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("both-ways")
    dep = synthetic_deployment(
        tmp, job={"projection": "target-pca"}, target_privacy={"row_clip": 15.0}
    )
    with run_server(load_source(dep.source_config)) as rs:
        set_source_address(dep, f"127.0.0.1:{rs.port}")
        out = run(load_target(dep.target_config), progress=False)
    assert out["target_disclosures"] == "dp" and out["target_epsilon_spent"] > 0
    return dep


def _verify(state: Path, *extra: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*prefix, *dpda_command("ledger", "verify", str(state), *extra)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_both_directions_verify_after_a_job_with_target_disclosures(finished) -> None:
    source, target = finished.workdir / "source", finished.workdir / "target"
    with sqlite3.connect(target / "state.sqlite") as conn:
        own = conn.execute("SELECT count(*) FROM ledger WHERE dataset='own-rows'").fetchone()[0]
    assert own >= 1  # the target's own-rows entry, which the source never holds
    for mine, theirs in ((source, target), (target, source)):
        r = _verify(mine, "--against", str(theirs))
        assert r.returncode == 0, r.stdout + r.stderr
        assert "checked: OK" in r.stdout


def test_a_lost_tail_is_still_caught_against_a_target_with_own_entries(finished, tmp_path) -> None:
    lost = tmp_path / "source"
    shutil.copytree(finished.workdir / "source", lost)
    with sqlite3.connect(lost / "state.sqlite") as conn:
        (last,) = conn.execute("SELECT max(seq) FROM ledger WHERE dataset='synthetic'").fetchone()
        conn.execute("DELETE FROM ledger WHERE dataset='synthetic' AND seq=?", (last,))
    r = _verify(lost, "--against", str(finished.workdir / "target"))
    assert r.returncode == 1
    assert "synthetic: 1 entries the peer holds" in r.stdout and "own-rows" not in r.stdout


def _read_only_copy(src: Path, top: Path) -> tuple[Path, tuple[str, ...]]:
    """A copy of ``src`` that no one may write (files 0444, folders 0555), and the prefix that
    runs a command under those modes: root writes past any mode, so under root the command
    runs without the capabilities that let it (``setpriv``)."""
    dst = top / "state"
    shutil.copytree(src, dst)
    for p in [*dst.rglob("*"), dst]:
        os.chmod(p, 0o555 if p.is_dir() else 0o444)
    if os.geteuid() != 0:
        return dst, ()
    if shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv: a read-only folder cannot be made")
    caps = "-dac_override,-dac_read_search,-fowner"
    return dst, ("setpriv", f"--bounding-set={caps}", "--inh-caps=-all")


def _writable_again(top: Path) -> None:
    for p in [top, *top.rglob("*")]:
        os.chmod(p, 0o700 if p.is_dir() else 0o600)


def test_a_read_only_copy_verifies(finished, tmp_path) -> None:
    copy, prefix = _read_only_copy(finished.workdir / "target", tmp_path)
    try:
        before = sorted(p.name for p in copy.iterdir())
        r = _verify(copy, "--against", str(finished.workdir / "source"), prefix=prefix)
        assert "Traceback" not in r.stderr, r.stderr
        assert r.returncode == 0, r.stdout + r.stderr
        assert "checked: OK" in r.stdout
        assert sorted(p.name for p in copy.iterdir()) == before  # nothing written beside it
    finally:
        _writable_again(copy)


def test_a_read_only_copy_with_a_pending_log_says_why(finished, tmp_path) -> None:
    """A copy taken while the daemon runs holds a write-ahead log SQLite cannot read in a
    read-only folder: the error names the file and what to do, and is not a traceback."""
    live = tmp_path / "live"
    shutil.copytree(finished.workdir / "target", live)
    keep = sqlite3.connect(live / "state.sqlite")  # holds the log open, as a running daemon
    keep.execute("PRAGMA journal_mode=WAL")
    keep.execute("PRAGMA wal_autocheckpoint=0")
    keep.execute("INSERT OR REPLACE INTO meta VALUES ('probe', '1')")
    keep.commit()
    shutil.copytree(live, tmp_path / "snap" / "src")
    keep.close()
    copy, prefix = _read_only_copy(tmp_path / "snap" / "src", tmp_path / "ro")
    try:
        assert (copy / "state.sqlite-wal").stat().st_size > 0
        r = _verify(copy, prefix=prefix)
        assert "Traceback" not in r.stderr, r.stderr
        if r.returncode != 0:  # this SQLite cannot read the log read-only: it says why
            assert "state.sqlite" in r.stderr and "write-ahead log" in r.stderr, r.stderr
        else:
            assert "checked: OK" in r.stdout
    finally:
        _writable_again(copy)
