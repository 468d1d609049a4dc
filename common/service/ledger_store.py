"""SQLite ledger store: WAL, ``synchronous=FULL``, schema version checked on open.

An ``append`` returns only after the transaction is committed and fsynced, so a release whose
entry was appended survives a SIGKILL of the process right after. The same file holds the
source's private tables (stored payloads for idempotent retries, sessions) — see
``source_party.state``.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from dpda.dp.ledger import LedgerEntry, head_hash
from dpda.errors import LedgerCorrupt
from dpda.service import signed_head
from dpda.service.keyfiles import restrict

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS ledger (
    dataset TEXT NOT NULL,
    seq INTEGER NOT NULL,
    entry_json TEXT NOT NULL,
    PRIMARY KEY (dataset, seq)
);
"""


def connect(path: str | Path) -> sqlite3.Connection:
    """Open (creating if needed) a dpda SQLite file with durable settings."""
    conn = sqlite3.connect(str(path), timeout=30, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    restrict(Path(path))  # the ledger, audit log and payloads: readable by this user only
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA foreign_keys=ON")
    conn.executescript(_SCHEMA)
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    if row is None:
        conn.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    elif int(row[0]) != SCHEMA_VERSION:
        conn.close()
        raise LedgerCorrupt(
            f"state file {path} has schema version {row[0]}, this dpda expects {SCHEMA_VERSION}"
        )
    return conn


def connect_read_only(path: str | Path) -> sqlite3.Connection:
    """Open a dpda SQLite file for reading only (``ledger verify``, ``show``, ``audit``): no
    setting is changed and nothing is written, so a read-only copy of a state dir works. A
    file in WAL mode whose folder cannot take SQLite's shared-memory file is opened as
    immutable when no write-ahead log is pending; otherwise the error says why. Raises
    ``sqlite3.Error`` (the caller names the file)."""
    path = Path(path)
    uri = path.resolve().as_uri()
    try:
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30, check_same_thread=False)
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError:
        wal = path.with_name(path.name + "-wal")
        if wal.is_file() and wal.stat().st_size > 0:
            raise sqlite3.OperationalError(
                f"its write-ahead log {wal.name} holds commits not yet in the file, and SQLite "
                "cannot read it without writing its shared-memory file beside it (the folder is "
                "read-only): copy the state dir to a writable folder, or stop the daemon first "
                "(a clean stop folds the log into the file)"
            ) from None
        conn = sqlite3.connect(f"{uri}?immutable=1", uri=True, check_same_thread=False)
    row = conn.execute(
        "SELECT value FROM meta WHERE key='schema_version'"
        if conn.execute("SELECT name FROM sqlite_master WHERE name='meta'").fetchone()
        else "SELECT NULL"
    ).fetchone()
    if row is None or row[0] is None or int(row[0]) != SCHEMA_VERSION:
        conn.close()
        raise LedgerCorrupt(
            f"state file {path} has schema version {row[0] if row else None}, this dpda "
            f"expects {SCHEMA_VERSION}"
        )
    return conn


class SqliteLedgerStore:
    """The ledger in SQLite, with each dataset's parsed entries kept in memory. Writes through
    this store update the copy after the commit; a commit by any other connection changes
    SQLite's ``data_version`` and drops the copy. Reads cost one pragma, no JSON."""

    def __init__(self, path: str | Path, conn: sqlite3.Connection | None = None) -> None:
        self.conn = conn or connect(path)
        self.head_file = signed_head.head_file(path)
        self.lock = threading.RLock()
        self._cache: dict[str, list[LedgerEntry]] = {}
        self._version = -1

    def _load(self, dataset: str) -> list[LedgerEntry]:
        (version,) = self.conn.execute("PRAGMA data_version").fetchone()
        if version != self._version:
            self._cache.clear()
            self._version = version
        cached = self._cache.get(dataset)
        if cached is None:
            rows = self.conn.execute(
                "SELECT entry_json FROM ledger WHERE dataset=? ORDER BY seq", (dataset,)
            ).fetchall()
            cached = self._cache[dataset] = [LedgerEntry.from_json(r[0]) for r in rows]
        return cached

    def entries(self, dataset: str | None = None) -> list[LedgerEntry]:
        with self.lock:
            if dataset is not None:
                return list(self._load(dataset))
            return [e for ds in self.datasets() for e in self._load(ds)]

    def datasets(self) -> list[str]:
        with self.lock:
            rows = self.conn.execute("SELECT DISTINCT dataset FROM ledger ORDER BY 1").fetchall()
        return [r[0] for r in rows]

    def append(self, entry: LedgerEntry) -> None:
        with self.lock:
            self.conn.execute("BEGIN IMMEDIATE")
            try:
                self._cache.pop(entry.dataset, None)  # re-read inside the transaction
                mine = self._load(entry.dataset)
                if entry.prev_hash != head_hash(mine) or entry.seq != len(mine):
                    raise LedgerCorrupt("ledger head moved: append out of order")
                self.conn.execute(
                    "INSERT INTO ledger VALUES (?, ?, ?)",
                    (entry.dataset, entry.seq, entry.to_json()),
                )
                self.conn.execute("COMMIT")
            except BaseException:
                self.conn.execute("ROLLBACK")
                self._cache.pop(entry.dataset, None)
                raise
            mine.append(entry)
            signed_head.record(self.head_file, entry)

    def update_signatures(
        self, dataset: str, seq: int, payload_sha256: str, source_sig: str, target_sig: str
    ) -> None:
        with self.lock:
            row = self.conn.execute(
                "SELECT entry_json FROM ledger WHERE dataset=? AND seq=?", (dataset, seq)
            ).fetchone()
            if row is None:
                raise LedgerCorrupt("no such ledger entry")
            d = json.loads(row[0])
            d["payload_sha256"] = payload_sha256 or d["payload_sha256"]
            d["source_sig"] = source_sig or d["source_sig"]
            d["target_sig"] = target_sig or d["target_sig"]
            new = LedgerEntry(**d)
            self.conn.execute(
                "UPDATE ledger SET entry_json=? WHERE dataset=? AND seq=?",
                (new.to_json(), dataset, seq),
            )
            cached = self._cache.get(dataset)
            if cached is not None and seq < len(cached):
                cached[seq] = new
            signed_head.record(self.head_file, new)
