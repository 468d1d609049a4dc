"""How often one job has started without finishing, per source: a source that fails a job on
purpose gets a bounded number of reruns, not an unbounded stream of requests from it.

The count lives in ``reruns.json`` in the state directory, keyed by the job's key (its terms,
the target's policy and its rows: ``dpda.target_party.own_rows.job_key``); a job that finishes
clears its count. This bounds attempts; it is not what keeps a rerun from being charged twice
(the target's own row queries are stored per job and reused, and a resumed session must keep
its id).
"""

from __future__ import annotations

import json
from pathlib import Path

from dpda.errors import ConfigError
from dpda.service.keyfiles import write_atomic

FILE = "reruns.json"


def _load(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return {str(k): int(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _save(path: Path, counts: dict[str, int]) -> None:
    write_atomic(path, json.dumps(counts, sort_keys=True).encode())


def start(state_dir: Path, source: str, job: str, limit: int) -> int:
    """Count one more start of ``job`` against ``source``; refused (``ConfigError`` naming
    ``max_reruns``) once it started ``limit`` times without finishing. Returns the count."""
    path = state_dir / FILE
    counts = _load(path)
    key = f"{source}/{job}"
    n = counts.get(key, 0)
    if n >= limit:
        raise ConfigError(
            f"max_reruns: this job started {n} times against {source} without finishing; "
            "check the source, then raise max_reruns or start a new job"
        )
    counts[key] = n + 1
    _save(path, counts)
    return n + 1


def finish(state_dir: Path, source: str, job: str) -> None:
    """The job finished: its count is cleared."""
    path = state_dir / FILE
    counts = _load(path)
    if counts.pop(f"{source}/{job}", None) is not None:
        _save(path, counts)
