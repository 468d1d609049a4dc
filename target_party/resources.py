"""What a job will need before it runs: its peak memory and its time, estimated from the shapes.

The job's memory is linear in the target's rows ``nt`` for every release. What it holds:

* the target's rows: the table (``nt × d`` float64) and its view (the scaled rows in float64 and
  float32, their ``ℓ``-column projection, the known labels): ``nt·(20d + 8ℓ + 8)`` bytes;
* one fit at a time: the cost, the kernel and the plan, ``p × m`` float32 each, for the ``p``
  points of a release (``q`` prototypes, at most ``q·synthetic_per_class`` class-gaussian
  points, ``B`` rows of a minibatch, or a piece of them when the compute bounds a task's
  memory) against ``m`` target rows (``nt``, or ``target_batch``), and the ``q × m`` class
  masses: ``12pm + 8qm`` bytes;
* the label-free selection's neighbour index over the projected rows, ``16·nt·ℓ`` bytes;
* the classifier's distances, in scikit-learn's row chunks, and the interpreter with its
  libraries (``BASE_MB``).

Nothing is ``nt²``: the selection's cluster score reads at most ``CLUSTER_SAMPLE`` rows, the
self-labelling step and the classifier compare rows with the release's points a block at a time.

The estimate is the shapes' sum times ``MEMORY_FACTOR`` (what numpy's temporaries, the
allocator and the loaders add), plus ``BASE_MB``; its time (CPU seconds) is ``BASE_SECONDS``
plus a cost per plan entry a fit builds and solves and one per target cell read and labelled.
The constants come from measured jobs (below; ``dpda bench scale --rows`` measures others)
and the figures are estimates, said to be so.
"""

from __future__ import annotations

from typing import Any

from dpda.terms import SessionTerms

# calibrated on two jobs of `dpda simulate` (prototypes, 64 columns, an unlabeled target) on 2
# cores, one for memory and one for time (docs/results.md#at-a-users-scale)
BASE_MB = 260.0  # the interpreter, numpy, scikit-learn, the CLI: the job at 2,000 rows
MEMORY_FACTOR = 1.85  # the calibration job's peak above BASE_MB over the shapes' sum
BASE_SECONDS = 3.0
SECONDS_PER_CELL = 3.0e-7  # a plan entry of one fit (cost, solve, map), CPU seconds
SECONDS_PER_ROW_COLUMN = 1.0e-7  # reading, scaling and labelling a target row, per column
SELECT_GRID = 12  # candidates of the label-free selection (dpda.target_party.selection.GRID)
SELECT_MAX_CELLS = 2e7  # its size limit (the same constant there)


def points_per_fit(terms: SessionTerms, n_source: int, n_classes: int, per_class: int) -> int:
    """Source points one release transports: the plan's rows."""
    q = max(1, n_classes)
    if terms.release == "prototypes":
        return q * terms.cells
    if terms.release == "class-gaussians":
        return q * per_class
    if terms.release == "sinkhorn-synthetic":
        return int(terms.synthetic_points)
    batch = terms.batch_size if terms.batch_size > 0 else n_source
    return max(1, min(batch, n_source))


def job_resources(
    terms: SessionTerms,
    steps: int,
    n_source: int,
    n_classes: int,
    n_target: int,
    n_features: int,
    *,
    target_batch: int = 0,
    per_class: int = 200,
    select: str = "circular",
    max_cells: int | None = None,
) -> dict[str, Any]:
    """The job's peak memory (MB) and wall time (s), estimated from its shapes."""
    q = max(1, n_classes)
    ell = min(terms.projection_dim, n_features)
    m = target_batch if 0 < target_batch < n_target else n_target
    p = points_per_fit(terms, n_source, q, per_class)
    piece = p if max_cells is None else max(1, min(p, max_cells // max(m, 1)))
    rows_b = n_target * (20 * n_features + 8 * ell + 8)
    fit_b = 12 * piece * m + 8 * q * m
    cells = p * m
    selects = select == "circular" and m == n_target and steps * cells <= SELECT_MAX_CELLS
    index_b = 16 * n_target * ell if selects else 0
    parts = {"target_rows_mb": rows_b / 2**20, "one_fit_mb": fit_b / 2**20}
    if index_b:
        parts["selection_index_mb"] = index_b / 2**20
    memory = BASE_MB + MEMORY_FACTOR * (rows_b + fit_b + index_b) / 2**20
    fits = steps * (1 + (SELECT_GRID - 1 if selects else 0))
    seconds = (
        BASE_SECONDS
        + SECONDS_PER_CELL * fits * cells
        + SECONDS_PER_ROW_COLUMN * n_target * n_features * (1 + (SELECT_GRID if selects else 0))
    )
    return {
        "peak_memory_mb": memory,
        "seconds": seconds,
        "by_part": parts,
        "plan_entries_per_fit": cells,
        "fits": fits,
        "linear_in": "the target's rows (no array holds nt² entries)",
        "how": "an estimate from the shapes, calibrated by measured jobs on 2 cores "
        f"(×{MEMORY_FACTOR} over the arrays' bytes, plus {BASE_MB:.0f} MB; CPU seconds, "
        "not wall time under load); another machine differs",
    }
