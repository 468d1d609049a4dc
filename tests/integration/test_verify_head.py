"""Standalone ``dpda ledger verify`` cannot be fooled through the countersigned head file: a
head deleted, or rewritten from an earlier entry, beside a ledger whose signatures and payload
hashes were stripped or whose tail was cut, and a ledger emptied while the audit log shows its
traffic, all fail; the output says what only ``--against`` can find."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from dpda.cli.main import main
from dpda.deployment import set_source_address
from dpda.dp.ledger import LedgerEntry
from dpda.service.config import load_source, load_target
from dpda.service.signed_head import FILE
from dpda.source_party.app import run_server
from dpda.target_party.app import run

from .helpers import synthetic_deployment

STEPS = 5


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verifyhead")
    dep = synthetic_deployment(
        tmp, job={"batch_size": 100, "steps": STEPS}, attribute_unit=True, retain=True
    )
    with run_server(load_source(dep.source_config)) as rs:
        set_source_address(dep, f"127.0.0.1:{rs.port}")
        run(load_target(dep.target_config), progress=False)
    return dep


def _copy(dep: Any, tmp_path: Path, side: str) -> tuple[Path, sqlite3.Connection]:
    dst = tmp_path / side
    shutil.copytree(dep.workdir / side, dst)
    return dst, sqlite3.connect(dst / "state.sqlite")


def _entries(conn: sqlite3.Connection) -> list[LedgerEntry]:
    rows = conn.execute("SELECT entry_json FROM ledger ORDER BY seq").fetchall()
    return [LedgerEntry.from_json(r[0]) for r in rows]


def _rewrite(conn: sqlite3.Connection, entries: list[LedgerEntry]) -> None:
    conn.execute("DELETE FROM ledger")
    for e in entries:
        conn.execute("INSERT INTO ledger VALUES (?, ?, ?)", (e.dataset, e.seq, e.to_json()))
    conn.commit()


def _strip(e: LedgerEntry) -> LedgerEntry:
    # the entry hash covers neither the signatures nor the payload hash: the chain still holds
    return LedgerEntry(**{**e.__dict__, "payload_sha256": "", "source_sig": "", "target_sig": ""})


def _verify(state: Path, capsys: Any) -> tuple[int, str]:
    code = main(["ledger", "verify", str(state)])
    return code, capsys.readouterr().out


def test_the_fixture_verifies_and_says_what_only_against_detects(finished, capsys) -> None:
    for side in ("source", "target"):
        code, out = _verify(finished.workdir / side, capsys)
        assert code == 0 and f"{STEPS} ledger entries checked: OK" in out
        assert "only the peer's copy shows those" in out
        assert "--against" in out


@pytest.mark.parametrize("side", ["source", "target"])
def test_stripped_signatures_and_hashes_with_the_head_deleted_fail(
    finished, tmp_path, capsys, side: str
) -> None:
    state, conn = _copy(finished, tmp_path, side)
    _rewrite(conn, [_strip(e) for e in _entries(conn)])
    conn.close()
    (state / FILE).unlink()
    code, out = _verify(state, capsys)
    assert code == 1 and "TAMPERED" in out
    assert "neither signed nor bound to a payload" in out


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_middle_deletion_with_stripped_signatures_and_no_head_fails(
    finished, tmp_path, capsys, side: str
) -> None:
    """Entry 1 deleted, the chain relinked, every signature and payload hash stripped, the head
    file deleted: the entries verify as a chain, and still fail."""
    state, conn = _copy(finished, tmp_path, side)
    entries = _entries(conn)
    kept = [entries[0]] + entries[2:]
    relinked: list[LedgerEntry] = []
    for i, e in enumerate(kept):
        prev = relinked[-1].entry_hash() if relinked else e.prev_hash
        relinked.append(_strip(LedgerEntry(**{**e.__dict__, "seq": i, "prev_hash": prev})))
    _rewrite(conn, relinked)
    conn.close()
    (state / FILE).unlink()
    code, out = _verify(state, capsys)
    assert code == 1 and "TAMPERED" in out
    assert f"{STEPS - 1} ledger entries checked" in out


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_head_rewritten_to_an_earlier_entry_fails(finished, tmp_path, capsys, side) -> None:
    state, conn = _copy(finished, tmp_path, side)
    entries = _entries(conn)
    conn.close()
    earlier = entries[-3]
    (state / FILE).write_text(json.dumps({earlier.dataset: json.loads(earlier.to_json())}))
    code, out = _verify(state, capsys)
    assert code == 1 and f"names entry {earlier.seq}, but entry {entries[-1].seq}" in out


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_cut_tail_under_a_head_rewritten_from_an_earlier_entry_fails(
    finished, tmp_path, capsys, side: str
) -> None:
    """Entries n−2 and n−1 cut and the head rewritten from entry n−3: what the audit log (the
    target's) or the stored payloads (the source's, whose audit tail is cut too) hold of the
    cut releases shows."""
    state, conn = _copy(finished, tmp_path, side)
    entries = _entries(conn)
    earlier = entries[-3]
    conn.execute("DELETE FROM ledger WHERE seq > ?", (earlier.seq,))
    if side == "source":
        rows = conn.execute("SELECT seq, record_json FROM audit").fetchall()
        cut = [s for s, t in rows if json.loads(t)["ledger_seq"] > earlier.seq]
        conn.execute("DELETE FROM audit WHERE seq >= ?", (min(cut),))
    conn.commit()
    conn.close()
    (state / FILE).write_text(json.dumps({earlier.dataset: json.loads(earlier.to_json())}))
    code, out = _verify(state, capsys)
    assert code == 1 and "entries were removed" in out


@pytest.mark.parametrize("side", ["source", "target"])
def test_an_emptied_ledger_without_its_head_is_not_ok(finished, tmp_path, capsys, side) -> None:
    state, conn = _copy(finished, tmp_path, side)
    conn.execute("DELETE FROM ledger")
    conn.commit()
    conn.close()
    (state / FILE).unlink()
    code, out = _verify(state, capsys)
    assert code == 1 and "0 ledger entries checked: TAMPERED" in out
