"""The source's store of reweighting outputs: outputs expire by the time they were stored (a
clock the caller passes), expired blocks are remembered, and a store written before the
stored-at column gains it, its outputs counted from when it is opened."""

from __future__ import annotations

import sqlite3

from dpda.source_party.store import SourceStore


def test_outputs_older_than_the_limit_are_deleted_and_remembered() -> None:
    store = SourceStore(sqlite3.connect(":memory:", isolation_level=None))
    store.put_outputs("d", 0, "s/reweight/0", b"old", stored_at=10.0)
    store.put_outputs("d", 1, "s/reweight/4", b"new", stored_at=20.0)
    assert store.expire_outputs(before=15.0, now=100.0) == 1
    assert store.outputs("d", 0) is None and store.outputs_expired("d", 0)
    assert store.outputs("d", 1) == b"new" and not store.outputs_expired("d", 1)
    assert store.expire_outputs(before=15.0, now=101.0) == 0  # nothing left that old


def test_a_store_without_the_stored_at_column_gains_it() -> None:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.execute(
        "CREATE TABLE reweight_answers (dataset TEXT NOT NULL, seq INTEGER NOT NULL, "
        "request_id TEXT NOT NULL UNIQUE, outputs BLOB NOT NULL, PRIMARY KEY (dataset, seq))"
    )
    conn.execute("INSERT INTO reweight_answers VALUES ('d', 0, 's/reweight/0', x'00')")
    store = SourceStore(conn, now=50.0)
    assert store.expire_outputs(before=49.0, now=60.0) == 0  # counted from when it opened
    store.put_outputs("d", 1, "s/reweight/4", b"x", stored_at=70.0)
    assert store.expire_outputs(before=51.0, now=80.0) == 1
    assert store.outputs_expired("d", 0) and store.outputs("d", 1) == b"x"
