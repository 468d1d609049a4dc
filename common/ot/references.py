"""Sizes of the rehearsal's non-private references (``dpda simulate``): what bounds their memory.

OTDA solves the exact entropic + group-lasso problem on a uniform subsample of at most
``REFERENCE_ROWS`` rows a side: its cost, kernel and plan are then at most ``REFERENCE_ROWS²``
float32 entries each (three buffers, 300 MB at 5,000), and the classifier trained on the mapped
subsample labels every target row. A nearest-neighbour classifier compares rows a block at a
time, in ``REFERENCE_MEMORY_MB`` of distances. Beyond them the references' memory is the
tables' own, linear in the rows.
"""

from __future__ import annotations

REFERENCE_ROWS = 5000
REFERENCE_MEMORY_MB = 256


def reference_method(ns: int, nt: int, max_rows: int = REFERENCE_ROWS) -> dict[str, str]:
    """How each reference runs on ``ns`` source and ``nt`` target rows (``max_rows``: OTDA's
    subsample a side, 0: every row)."""
    rs = min(ns, max_rows) if max_rows > 0 else ns
    rt = min(nt, max_rows) if max_rows > 0 else nt
    if rs == ns and rt == nt:
        otda = f"exact entropic + group-lasso OT on every row ({ns} × {nt})"
    else:
        otda = (
            f"exact entropic + group-lasso OT on a uniform subsample of {rs} of {ns} source "
            f"and {rt} of {nt} target rows; the classifier trained on the mapped subsample "
            "labels every target row"
        )
    return {"source_only": "every row (a nearest-neighbour classifier by row blocks)", "otda": otda}
