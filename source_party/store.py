"""The source daemon's own tables (SQLite, beside the ledger): its sessions, and the payload of
every charged release, kept so that a retried request gets the stored payload back instead of a
second draw. Nothing here charges, signs or decides; the handlers call it under their lock.

* ``sessions`` — a release session's terms, projection and the target's disclosed scaling,
  enough to rebuild the session after a restart;
* ``payloads`` — a batch release (its features and noisy counts);
* ``pate_answers`` — a PATE answer's labels;
* ``reweight_answers`` — a reweighting block's outputs and when they were stored;
* ``reweight_expired`` — the blocks whose outputs were deleted for their age (``expire_outputs``).

The three payload tables are keyed by (dataset, ledger seq), with the request id unique.
"""

from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass

import numpy as np

from dpda.data.preprocessing import Scaling
from dpda.dp.preprocessing_dp import Standardization
from dpda.protocol import BatchRelease, SessionInfo
from dpda.terms import SessionTerms

SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, peer TEXT NOT NULL, dataset TEXT NOT NULL,
    terms_json TEXT NOT NULL, projection BLOB NOT NULL, proj_shape TEXT NOT NULL,
    scaling_mean BLOB, scaling_std BLOB, closed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS pate_answers (
    dataset TEXT NOT NULL, seq INTEGER NOT NULL, request_id TEXT NOT NULL UNIQUE,
    labels BLOB NOT NULL, PRIMARY KEY (dataset, seq)
);
CREATE TABLE IF NOT EXISTS reweight_answers (
    dataset TEXT NOT NULL, seq INTEGER NOT NULL, request_id TEXT NOT NULL UNIQUE,
    outputs BLOB NOT NULL, stored_at REAL, PRIMARY KEY (dataset, seq)
);
CREATE TABLE IF NOT EXISTS reweight_expired (
    dataset TEXT NOT NULL, seq INTEGER NOT NULL, request_id TEXT NOT NULL,
    expired_at REAL NOT NULL, PRIMARY KEY (dataset, seq)
);
CREATE TABLE IF NOT EXISTS payloads (
    dataset TEXT NOT NULL, seq INTEGER NOT NULL, request_id TEXT NOT NULL UNIQUE,
    z BLOB NOT NULL, z_rows INTEGER NOT NULL, counts BLOB NOT NULL,
    PRIMARY KEY (dataset, seq)
);
CREATE TABLE IF NOT EXISTS payload_statistics (
    dataset TEXT NOT NULL, seq INTEGER NOT NULL, statistics BLOB NOT NULL,
    PRIMARY KEY (dataset, seq)
);
"""


@dataclass(frozen=True)
class StoredSession:
    """A session's row: who opened it, on what, under which terms, and what the target
    disclosed (its projection and scaling)."""

    peer: str
    dataset: str
    terms: SessionTerms
    projection: np.ndarray
    scaling: Scaling | None
    closed: bool


class SourceStore:
    """The tables above on one connection (the daemon's; the caller serialises access)."""

    def __init__(self, conn: sqlite3.Connection, now: float | None = None) -> None:
        """``now``: wall-clock seconds that reweighting outputs stored without a time (by a
        store without the column) count as stored at; the current time when None."""
        self.conn = conn
        self.conn.executescript(SCHEMA)
        cols = {r[1] for r in conn.execute("PRAGMA table_info(reweight_answers)")}
        if "stored_at" not in cols:
            conn.execute("ALTER TABLE reweight_answers ADD COLUMN stored_at REAL")
        conn.execute(
            "UPDATE reweight_answers SET stored_at=? WHERE stored_at IS NULL",
            (time.time() if now is None else now,),
        )

    # -------------------------------------------------------------------------- sessions
    def add_session(
        self, peer: str, terms: SessionTerms, info: SessionInfo, scaling: Scaling | None
    ) -> None:
        m = np.ascontiguousarray(info.projection, dtype="<f8")
        self.conn.execute(
            "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
            (
                info.session_id,
                peer,
                terms.dataset,
                terms.model_dump_json(),
                m.tobytes(),
                json.dumps(list(m.shape)),
                None if scaling is None else np.ascontiguousarray(scaling.mean, "<f8").tobytes(),
                None if scaling is None else np.ascontiguousarray(scaling.std, "<f8").tobytes(),
            ),
        )

    def session_owner(self, session_id: str) -> tuple[str, str, bool] | None:
        """(peer, dataset, closed) of a stored session, or None."""
        row = self.conn.execute(
            "SELECT peer, dataset, closed FROM sessions WHERE session_id=?", (session_id,)
        ).fetchone()
        return None if row is None else (row[0], row[1], bool(row[2]))

    def session(self, session_id: str) -> StoredSession | None:
        """The whole stored session (to rebuild it after a restart), or None."""
        row = self.conn.execute(
            "SELECT peer, dataset, terms_json, projection, proj_shape, scaling_mean,"
            " scaling_std, closed FROM sessions WHERE session_id=?",
            (session_id,),
        ).fetchone()
        if row is None:
            return None
        m = np.frombuffer(row[3], dtype="<f8").reshape(json.loads(row[4]))
        scaling = None
        if row[5] is not None:
            scaling = Scaling(np.frombuffer(row[5], "<f8"), np.frombuffer(row[6], "<f8"))
        terms = SessionTerms.model_validate_json(row[2])
        return StoredSession(row[0], row[1], terms, m, scaling, bool(row[7]))

    def open_sessions(self, peer: str | None = None) -> list[tuple[str, str]]:
        """(session id, dataset) of the open sessions, of one peer or of all."""
        if peer is None:
            rows = self.conn.execute("SELECT session_id, dataset FROM sessions WHERE closed=0")
        else:
            rows = self.conn.execute(
                "SELECT session_id, dataset FROM sessions WHERE peer=? AND closed=0", (peer,)
            )
        return [(sid, ds) for sid, ds in rows.fetchall()]

    def count_open(self, peer: str) -> int:
        (n,) = self.conn.execute(
            "SELECT COUNT(*) FROM sessions WHERE peer=? AND closed=0", (peer,)
        ).fetchone()
        return int(n)

    def close_session(self, session_id: str) -> None:
        self.conn.execute("UPDATE sessions SET closed=1 WHERE session_id=?", (session_id,))

    # -------------------------------------------------------------------------- payloads
    def put_batch(self, dataset: str, rel: BatchRelease, request_id: str) -> None:
        self.conn.execute(
            "INSERT INTO payloads VALUES (?, ?, ?, ?, ?, ?)",
            (
                dataset,
                rel.ledger_seq,
                request_id,
                np.ascontiguousarray(rel.z, "<f8").tobytes(),
                rel.z.shape[0],
                np.ascontiguousarray(rel.noisy_counts, "<i8").tobytes(),
            ),
        )
        stats = rel.statistics_vector()
        if stats is not None:  # the session's DP standardization, sent with its first release
            self.conn.execute(
                "INSERT INTO payload_statistics VALUES (?, ?, ?)",
                (dataset, rel.ledger_seq, stats.tobytes()),
            )

    def statistics(self, dataset: str, seq: int) -> Standardization | None:
        """The DP standardization stored with the release at ``seq``, or None."""
        row = self.conn.execute(
            "SELECT statistics FROM payload_statistics WHERE dataset=? AND seq=?", (dataset, seq)
        ).fetchone()
        if row is None:
            return None
        v = np.frombuffer(row[0], "<f8")
        k = (v.size - 1) // 2
        nan = float("nan")  # the counts' estimates are the first process's report only
        return Standardization(v[:k].copy(), v[k : 2 * k].copy(), float(v[-1]), nan, nan)

    def batch(self, dataset: str, seq: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The stored (features, noisy counts) of the batch release at ``seq``, or None."""
        row = self.conn.execute(
            "SELECT z, z_rows, counts FROM payloads WHERE dataset=? AND seq=?", (dataset, seq)
        ).fetchone()
        if row is None:
            return None
        return np.frombuffer(row[0], "<f8").reshape(row[1], -1), np.frombuffer(row[2], "<i8")

    def put_answer(self, dataset: str, seq: int, request_id: str, labels: bytes) -> None:
        self.conn.execute(
            "INSERT INTO pate_answers VALUES (?, ?, ?, ?)", (dataset, seq, request_id, labels)
        )

    def answer(self, dataset: str, seq: int) -> bytes | None:
        """The stored labels of the PATE answer at ``seq``, or None."""
        row = self.conn.execute(
            "SELECT labels FROM pate_answers WHERE dataset=? AND seq=?", (dataset, seq)
        ).fetchone()
        return None if row is None else bytes(row[0])

    def put_outputs(
        self, dataset: str, seq: int, request_id: str, outputs: bytes, stored_at: float
    ) -> None:
        self.conn.execute(
            "INSERT INTO reweight_answers (dataset, seq, request_id, outputs, stored_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (dataset, seq, request_id, outputs, stored_at),
        )

    def expire_outputs(self, before: float, now: float) -> int:
        """Delete the reweighting outputs stored before ``before`` (wall-clock seconds),
        remembering which blocks they were (``outputs_expired``); how many were deleted."""
        # remembered first: a crash between the two leaves the outputs, found and sent again
        self.conn.execute(
            "INSERT OR REPLACE INTO reweight_expired SELECT dataset, seq, request_id, ? "
            "FROM reweight_answers WHERE stored_at < ?",
            (now, before),
        )
        cur = self.conn.execute("DELETE FROM reweight_answers WHERE stored_at < ?", (before,))
        return int(cur.rowcount)

    def outputs_expired(self, dataset: str, seq: int) -> bool:
        """Whether the outputs of the reweighting block at ``seq`` were deleted for their age."""
        row = self.conn.execute(
            "SELECT 1 FROM reweight_expired WHERE dataset=? AND seq=?", (dataset, seq)
        ).fetchone()
        return row is not None

    def outputs(self, dataset: str, seq: int) -> bytes | None:
        """The stored outputs of the reweighting block at ``seq``, or None."""
        row = self.conn.execute(
            "SELECT outputs FROM reweight_answers WHERE dataset=? AND seq=?", (dataset, seq)
        ).fetchone()
        return None if row is None else bytes(row[0])
