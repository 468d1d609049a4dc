"""Bounds on the reweighting outputs the source stores (each block is kept so that a retry gets
the same answer): per session and per peer, checked before a block is charged. A block that
would not fit is refused (``PolicyRefused``, naming the limit) with nothing charged, drawn or
stored; the limits are public numbers, never data. Outputs older than
``limits.reweight_outputs_max_age_s`` are deleted (``rpc_reweighting.Reweighting.expire``),
which frees their share; a retry of an expired block is refused, never drawn or charged again.

One step stores a noisy gradient over the caller's public rows (``noisy-md``: 8 bytes a row)
or one vertex index (8 bytes).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from dpda.errors import PolicyRefused


def step_bytes(method: str, public_rows: int) -> int:
    return 8 * public_rows if method == "noisy-md" else 8


def stored_bytes(conn: sqlite3.Connection, dataset: str, seqs: Sequence[int]) -> int:
    """Bytes of the stored outputs of the ledger entries ``seqs`` of ``dataset``."""
    total = 0
    for i in range(0, len(seqs), 500):
        chunk = list(seqs[i : i + 500])
        marks = ",".join("?" * len(chunk))
        (n,) = conn.execute(
            f"SELECT COALESCE(SUM(LENGTH(outputs)), 0) FROM reweight_answers "
            f"WHERE dataset=? AND seq IN ({marks})",
            (dataset, *chunk),
        ).fetchone()
        total += int(n)
    return total


def check(new: int, session: int, peer: int, per_session: int, per_peer: int) -> None:
    """Refuse a block of ``new`` bytes beside ``session`` and ``peer`` bytes already stored."""
    if session + new > per_session:
        raise PolicyRefused(
            f"count: the session's stored outputs would exceed "
            f"limits.reweight_bytes_per_session ({per_session} bytes)",
            public=True,
        )
    if peer + new > per_peer:
        raise PolicyRefused(
            f"count: the peer's stored outputs would exceed "
            f"limits.reweight_bytes_per_peer ({per_peer} bytes)",
            public=True,
        )
