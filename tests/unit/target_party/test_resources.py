"""``dpda target plan``'s resource estimate: linear in the target's rows, each part from its
shapes (the plan of one fit, the rows and their view, the selection's index)."""

from __future__ import annotations

import pytest

from dpda.target_party import resources as R
from dpda.terms import SessionTerms


def _terms(**kw) -> SessionTerms:
    return SessionTerms(dataset="d", epsilon=8.0, delta=1e-6, **kw)


def test_the_estimate_grows_linearly_in_the_target_rows() -> None:
    t = _terms()
    one = R.job_resources(t, 1, 10_000, 10, 100_000, 64)
    ten = R.job_resources(t, 1, 10_000, 10, 1_000_000, 64)
    added = (ten["peak_memory_mb"] - R.BASE_MB) / (one["peak_memory_mb"] - R.BASE_MB)
    assert added == pytest.approx(10.0)
    assert ten["seconds"] > one["seconds"]
    rows = 1_000_000 * (20 * 64 + 8 * t.projection_dim + 8) / 2**20
    assert ten["by_part"]["target_rows_mb"] == pytest.approx(rows)
    # prototypes: q points a fit, three float32 buffers and the class masses
    assert ten["plan_entries_per_fit"] == 10 * 1_000_000
    assert ten["by_part"]["one_fit_mb"] == pytest.approx((12 * 10 + 8 * 10) * 1e6 / 2**20)


def test_each_release_transports_its_own_number_of_points() -> None:
    assert R.points_per_fit(_terms(), 5000, 7, 200) == 7
    assert R.points_per_fit(_terms(release="class-gaussians"), 5000, 7, 50) == 350
    rows = _terms(release="rows", privacy_unit="attribute", batch_size=1000, steps=5)
    assert R.points_per_fit(rows, 5000, 7, 200) == 1000
    assert R.points_per_fit(rows, 600, 7, 200) == 600


def test_a_task_memory_bound_and_a_target_batch_bound_one_fit() -> None:
    rows = _terms(release="rows", privacy_unit="attribute", batch_size=1000, steps=5)
    free = R.job_resources(rows, 5, 50_000, 10, 1_000_000, 64, select="none")
    cut = R.job_resources(rows, 5, 50_000, 10, 1_000_000, 64, select="none", max_cells=10**7)
    sub = R.job_resources(rows, 5, 50_000, 10, 1_000_000, 64, select="none", target_batch=5000)
    assert free["by_part"]["one_fit_mb"] == pytest.approx((12 * 1000 + 80) * 1e6 / 2**20)
    assert cut["by_part"]["one_fit_mb"] == pytest.approx((12 * 10 + 80) * 1e6 / 2**20)
    assert sub["plan_entries_per_fit"] == 1000 * 5000
    assert "selection_index_mb" not in free["by_part"]


def test_the_selection_index_counts_only_where_the_selection_runs() -> None:
    t = _terms()
    small = R.job_resources(t, 1, 10_000, 10, 100_000, 64)
    assert small["by_part"]["selection_index_mb"] == pytest.approx(16 * 100_000 * 20 / 2**20)
    assert small["fits"] == R.SELECT_GRID
    off = R.job_resources(t, 1, 10_000, 10, 100_000, 64, select="none")
    assert off["fits"] == 1 and off["peak_memory_mb"] < small["peak_memory_mb"]
    assert "estimate" in small["how"]


def test_the_estimate_counts_the_selection_the_job_runs() -> None:
    from dpda.target_party import selection

    assert R.SELECT_GRID == len(selection.GRID)
    assert R.SELECT_MAX_CELLS == selection.SELECT_MAX_CELLS
