"""The last entry of each dataset's ledger that both parties signed, kept beside the ledger.

A ledger checked on its own proves only that what it holds is consistent: a tail cut off, a
lost write-ahead log or an emptied table leaves a shorter chain that still verifies. Each
party therefore keeps, in a file of its own (``countersigned_head.json`` next to
``state.sqlite``, replaced atomically), the highest entry of each dataset that carries both
signatures — the whole entry, so its signatures can be checked again. ``check`` then fails a
ledger that holds fewer entries than that head, or a different entry at its place.

What this does not catch, and ``dpda ledger verify --against PEER`` does: entries past the
last countersigned head (one in flight), and a ledger rolled back together with this file to
an earlier, genuinely signed state.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dpda.dp.ledger import LedgerEntry
from dpda.service.keyfiles import write_atomic

FILE = "countersigned_head.json"


def head_file(db_path: str | Path) -> Path:
    return Path(db_path).with_name(FILE)


def load(path: Path) -> dict[str, LedgerEntry] | None:
    """The recorded head entry per dataset; None when the file is absent. A file that does not
    parse raises ``ValueError``."""
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return {ds: LedgerEntry(**e) for ds, e in data.items()}


def record(path: Path, entry: LedgerEntry) -> None:
    """Note ``entry`` (signed by both parties) as its dataset's head if it is past the one
    recorded; the file is written beside, fsynced, then renamed over the old one."""
    if not (entry.source_sig and entry.target_sig):
        return
    try:
        heads = load(path) or {}
    except (ValueError, TypeError):
        heads = {}  # a damaged record is rebuilt from the entries signed from now on
    held = heads.get(entry.dataset)
    if held is not None and held.seq >= entry.seq:
        return
    heads[entry.dataset] = entry
    data: dict[str, Any] = {ds: json.loads(e.to_json()) for ds, e in sorted(heads.items())}
    write_atomic(path, json.dumps(data, sort_keys=True).encode())


def check(heads: dict[str, LedgerEntry], ledger: dict[str, list[LedgerEntry]]) -> list[str]:
    """Problems: a dataset whose ledger holds fewer entries than its countersigned head, or
    another entry (or the same one without its signatures) where the head was."""
    problems: list[str] = []
    for ds, head in sorted(heads.items()):
        entries = ledger.get(ds, [])
        length = head.seq + 1
        if len(entries) < length:
            problems.append(
                f"{ds}: {len(entries)} entries, but entry {head.seq} was countersigned: "
                f"the ledger was truncated below its last countersigned head ({length} entries)"
            )
            continue
        here = entries[head.seq]
        if here.entry_hash() != head.entry_hash():
            problems.append(f"{ds} entry {head.seq}: differs from the countersigned head")
        elif (here.source_sig, here.target_sig) != (head.source_sig, head.target_sig):
            problems.append(f"{ds} entry {head.seq}: signatures differ from the countersigned head")
    return problems
