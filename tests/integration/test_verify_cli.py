"""`dpda ledger verify` / `dpda audit verify` catch every kind of tampering."""

from __future__ import annotations

import json
import shutil
import sqlite3

import pytest

from dpda.cli.main import main
from dpda.deployment import set_source_address
from dpda.service.config import load_source, load_target
from dpda.source_party.app import run_server
from dpda.target_party.app import run

from .helpers import synthetic_deployment


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    dep = synthetic_deployment(
        tmp, job={"batch_size": 100, "steps": 3}, attribute_unit=True, retain=True
    )
    src_cfg = load_source(dep.source_config)
    with run_server(src_cfg) as rs:
        set_source_address(dep, f"127.0.0.1:{rs.port}")
        tcfg = load_target(dep.target_config)
        run(tcfg, progress=False)  # both daemons write keys.json (public keys by role)
    return dep


def _copy(dep, tmp_path, side: str = "source"):
    dst = tmp_path / side
    shutil.copytree(dep.workdir / side, dst)
    return dst, sqlite3.connect(dst / "state.sqlite")


def _edit_entry(conn: sqlite3.Connection, seq: int, fn) -> None:
    (text,) = conn.execute("SELECT entry_json FROM ledger WHERE seq=?", (seq,)).fetchone()
    d = json.loads(text)
    fn(d)
    conn.execute("UPDATE ledger SET entry_json=? WHERE seq=?", (json.dumps(d), seq))
    conn.commit()


def test_untouched_state_verifies(finished, capsys) -> None:
    for side in ("source", "target"):
        assert main(["ledger", "verify", str(finished.workdir / side)]) == 0
        assert main(["audit", "verify", str(finished.workdir / side)]) == 0
    assert main(["audit", "report", str(finished.workdir / "source")]) == 0
    out = capsys.readouterr().out
    assert (
        "3 ledger entries checked: OK" in out
        and "DP releases of synthetic (gaussian-features+counts): 3" in out
    )


TAMPER = {
    "edited value": lambda c: _edit_entry(c, 1, lambda d: d.update(spend_after=0.1)),
    "edited event": lambda c: _edit_entry(
        c, 0, lambda d: d["dp_event"].update(sampling_probability=0.01)
    ),
    "bad signature": lambda c: _edit_entry(c, 2, lambda d: d.update(source_sig="A" * 86 + "==")),
    "deleted entry": lambda c: (c.execute("DELETE FROM ledger WHERE seq=1"), c.commit()),
    "reordered": lambda c: (
        c.execute("UPDATE ledger SET seq=-1 WHERE seq=0"),
        c.execute("UPDATE ledger SET seq=0 WHERE seq=1"),
        c.execute("UPDATE ledger SET seq=1 WHERE seq=-1"),
        c.commit(),
    ),
    "payload bytes": lambda c: (
        c.execute("UPDATE payloads SET counts=zeroblob(length(counts)) WHERE seq=0"),
        c.commit(),
    ),
    # the source's delivered releases then have no record of the messages that carried them
    "wiped audit log": lambda c: (c.execute("DELETE FROM audit"), c.commit()),
    "audit log truncated": lambda c: (  # from the record of the last release on
        c.execute(
            "DELETE FROM audit WHERE seq >= (SELECT MAX(seq) FROM audit "
            "WHERE json_extract(record_json, '$.ledger_seq') >= 0)"
        ),
        c.commit(),
    ),
}


@pytest.mark.parametrize("case", sorted(TAMPER))
def test_ledger_tampering_fails_verify(finished, tmp_path, case: str) -> None:
    state, conn = _copy(finished, tmp_path)
    TAMPER[case](conn)
    conn.close()
    assert main(["ledger", "verify", str(state)]) == 1


def test_missing_keys_json_fails_verify(finished, tmp_path) -> None:
    """9ac3bc1 skipped every signature check when keys.json was gone."""
    for side in ("source", "target"):
        state, conn = _copy(finished, tmp_path / side, side)
        conn.close()
        (state / "keys.json").unlink()
        assert main(["ledger", "verify", str(state)]) == 1


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_signature_by_the_wrong_role_fails_verify(finished, tmp_path, side: str) -> None:
    """9ac3bc1 accepted a signature by any known key for either role: the source could forge
    every countersignature with its own key."""
    from dpda.dp.ledger import LedgerEntry
    from dpda.service import signing

    state, conn = _copy(finished, tmp_path, side)
    source_key = signing.load_private(finished.source_keys.signing_key)
    (text,) = conn.execute("SELECT entry_json FROM ledger WHERE seq=1").fetchone()
    forged = signing.sign(source_key, LedgerEntry.from_json(text).signed_message())
    _edit_entry(conn, 1, lambda d: d.update(target_sig=forged))
    conn.close()
    assert main(["ledger", "verify", str(state)]) == 1


def test_a_lost_tail_shows_against_the_peers_copy(finished, tmp_path, capsys) -> None:
    """Deleting the last entry together with the matching audit tail: against the target's
    countersigned copy it shows as a lost tail."""
    state, conn = _copy(finished, tmp_path)
    conn.execute("DELETE FROM ledger WHERE seq=2")
    conn.execute("DELETE FROM payloads WHERE seq=2")
    rows = conn.execute("SELECT seq, record_json FROM audit").fetchall()
    tail = [seq for seq, text in rows if json.loads(text)["ledger_seq"] == 2]
    assert tail  # the release of entry 2 was audited; its records go with it
    conn.execute("DELETE FROM audit WHERE seq >= ?", (min(tail),))
    conn.commit()
    conn.close()
    target = str(finished.workdir / "target")
    assert main(["ledger", "verify", str(state), "--against", target]) == 1
    assert "missing here: a lost or truncated tail" in capsys.readouterr().out
    assert main(["ledger", "verify", str(finished.workdir / "source"), "--against", target]) == 0


def _relink(conn: sqlite3.Connection) -> None:
    """Rewrite the chain after entry 1 was deleted: entry 2 becomes entry 1, linked to entry 0
    (the entry hashes recomputed, the signatures that no longer match stripped)."""
    from dpda.dp.ledger import LedgerEntry

    conn.execute("DELETE FROM ledger WHERE seq=1")
    (text,) = conn.execute("SELECT entry_json FROM ledger WHERE seq=0").fetchone()
    prev = LedgerEntry.from_json(text).entry_hash()
    _edit_entry(conn, 2, lambda d: d.update(seq=1, prev_hash=prev, source_sig="", target_sig=""))
    conn.execute("UPDATE ledger SET seq=1 WHERE seq=2")
    conn.commit()


STANDALONE_LOSS = {
    "tail truncated": lambda c: (c.execute("DELETE FROM ledger WHERE seq=2"), c.commit()),
    "ledger emptied (a lost WAL)": lambda c: (c.execute("DELETE FROM ledger"), c.commit()),
    "middle entry deleted, chain rewritten": _relink,
    "signatures stripped": lambda c: [
        _edit_entry(c, seq, lambda d: d.update(source_sig="", target_sig="")) for seq in (0, 1)
    ],
}


@pytest.mark.parametrize("case", sorted(STANDALONE_LOSS))
@pytest.mark.parametrize("side", ["source", "target"])
def test_a_loss_below_the_countersigned_head_fails_standalone(
    finished, tmp_path, capsys, side: str, case: str
) -> None:
    """Without a peer copy, a ledger that lost entries below the last head both parties signed
    (or their signatures) fails, and the output says what a standalone check cannot see."""
    state, conn = _copy(finished, tmp_path, side)
    STANDALONE_LOSS[case](conn)
    conn.close()
    assert main(["ledger", "verify", str(state)]) == 1
    out = capsys.readouterr().out
    assert "TAMPERED" in out and "cannot be detected" in out


def test_a_missing_or_forged_head_record_fails(finished, tmp_path, capsys) -> None:
    """Deleting the countersigned head beside a ledger with countersigned entries fails; so
    does a head whose signatures are not the parties'."""
    from dpda.service.signed_head import FILE

    state, conn = _copy(finished, tmp_path)
    conn.close()
    head = json.loads((state / FILE).read_text())
    (state / FILE).unlink()
    assert main(["ledger", "verify", str(state)]) == 1
    assert f"{FILE}: missing" in capsys.readouterr().out
    for entry in head.values():
        entry["target_sig"] = entry["source_sig"]
    (state / FILE).write_text(json.dumps(head))
    assert main(["ledger", "verify", str(state)]) == 1
    assert "head's signatures do not verify" in capsys.readouterr().out


def test_audit_tampering_fails_verify(finished, tmp_path) -> None:
    state, conn = _copy(finished, tmp_path, "target")
    (text,) = conn.execute("SELECT record_json FROM audit WHERE seq=3").fetchone()
    d = json.loads(text)
    d["size"] += 1
    conn.execute("UPDATE audit SET record_json=? WHERE seq=3", (json.dumps(d),))
    conn.commit()
    conn.close()
    assert main(["audit", "verify", str(state)]) == 1


def test_a_rewritten_audit_chain_fails_on_its_signatures(finished, tmp_path) -> None:
    """Someone with write access edits a record and recomputes the whole hash chain: the chain
    verifies, the records' signatures (by this side's key) do not."""
    from dpda.service.audit import AuditRecord

    state, conn = _copy(finished, tmp_path, "target")
    rows = conn.execute("SELECT seq, record_json FROM audit ORDER BY seq").fetchall()
    prev = "0" * 64
    for seq, text in rows:
        d = json.loads(text)
        if seq == 3:
            d["size"] += 1
        d["prev_hash"] = prev
        prev = AuditRecord(**d).record_hash()
        conn.execute("UPDATE audit SET record_json=? WHERE seq=?", (json.dumps(d), seq))
    conn.commit()
    conn.close()
    assert main(["audit", "verify", str(state)]) == 1


def test_audit_detects_a_retained_payload_that_differs(finished, tmp_path) -> None:
    state, conn = _copy(finished, tmp_path)
    conn.execute("UPDATE audit SET payload=X'00' WHERE payload IS NOT NULL AND seq > 3")
    conn.commit()
    conn.close()
    assert main(["audit", "verify", str(state)]) == 1


def test_pate_answers_are_audited_and_covered_by_the_ledger(tmp_path, capsys) -> None:
    dep = synthetic_deployment(
        tmp_path, job={"method": "dpda+pate", "pate_queries": 30, "pate_teachers": 10}
    )
    with run_server(load_source(dep.source_config)) as rs:
        set_source_address(dep, f"127.0.0.1:{rs.port}")
        run(load_target(dep.target_config), progress=False)
    for side in ("source", "target"):
        assert main(["audit", "verify", str(dep.workdir / side)]) == 0
    assert main(["audit", "report", str(dep.workdir / "source")]) == 0
    out = capsys.readouterr().out
    assert "DP releases of synthetic (pate-votes): 1" in out
    assert "DP releases of synthetic (gaussian-features+counts): 1" in out
