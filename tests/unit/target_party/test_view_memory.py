"""The target's view and its OT space at linear memory: per-row maps by row blocks and the
basis from the scatter matrix give what the whole-table forms give."""

from __future__ import annotations

import numpy as np
import pytest

from dpda.data import preprocessing as P
from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling, per_row
from dpda.dp.mechanisms import clip_rows
from dpda.target_party import view as V
from dpda.terms import SessionTerms


@pytest.mark.parametrize("representation", ["raw", "l2", "sqrt"])
def test_the_view_by_row_blocks_is_the_whole_table_view(representation, monkeypatch) -> None:
    monkeypatch.setattr(P, "ROW_BLOCK", 7)  # several blocks, the last one short
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(50, 6))) * 3
    # without the DP standardization (raw rows' default), which the block path does not change
    terms = SessionTerms(dataset="d", epsilon=1.0, delta=1e-5, clip_norm=2.0, preprocessing="none")
    got = V.target_view(Domain("t", x, None, 0), representation, scaling_mode="zscore", terms=terms)
    rep = clip_rows(per_row(x, representation), V.natural_clip(representation, 2.0))
    want = Scaling.of(rep, "zscore").apply(rep)
    np.testing.assert_array_equal(got.x, want)
    space, proj = V.local_space(got, 1.5, 3)
    scaled = got.scaling.apply(clip_rows(got.rows(), 1.5))
    np.testing.assert_allclose(proj, scaled @ space.basis, rtol=1e-12, atol=1e-12)


def test_the_basis_from_the_scatter_matrix_spans_the_svd_directions(monkeypatch) -> None:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 8)) * np.array([9, 7, 5, 3, 1, 0.5, 0.2, 0.1]) + 4.0
    svd = V.target_pca_basis(x, 3)
    monkeypatch.setattr(V, "PCA_SVD_ROWS", 100)
    monkeypatch.setattr(P, "ROW_BLOCK", 64)
    eig = V.target_pca_basis(x, 3)
    assert eig.shape == (8, 3)
    np.testing.assert_allclose(eig.T @ eig, np.eye(3), atol=1e-12)
    # the same directions, each up to its sign
    np.testing.assert_allclose(np.abs(svd.T @ eig), np.eye(3), atol=1e-9)


def test_the_view_a_job_replaces_is_freed_while_the_job_runs(monkeypatch) -> None:
    """The rows moved into the source's DP standardization replace the target's first view: the
    job's memory then holds one view of the rows, not two (no collector run: freed as the
    job drops it)."""
    import weakref

    from dpda import simulation as S
    from dpda.target_party import pipeline as PL
    from dpda.target_party.view import AdaptConfig

    first: list[weakref.ref] = []
    own_view = S._own_view

    def recorded(*args, **kwargs):
        v = own_view(*args, **kwargs)
        first.append(weakref.ref(v))
        return v

    seen: list[tuple[bool, bool]] = []  # per OT space built: (its view is the first, first alive)
    local_space = PL.local_space

    def watched(view, *args):
        seen.append((view is first[0](), first[0]() is not None))
        return local_space(view, *args)

    monkeypatch.setattr(S, "_own_view", recorded)
    monkeypatch.setattr(PL, "local_space", watched)
    rng = np.random.default_rng(2)
    xs, xt = rng.normal(size=(300, 6)) * 40, rng.normal(size=(200, 6)) * 60 + 5
    s = Domain("d", xs, rng.integers(0, 2, 300), 2)
    t = Domain("t", xt, None, 2)
    terms = SessionTerms(dataset="d", epsilon=8.0, delta=1e-4)  # raw rows: standardized
    S.simulate(s, t, terms, "raw", AdaptConfig(seed=0), 0, baselines=False)
    # the first space on the target's own view; after the source's statistics, the moved view's,
    # with the first one gone
    assert seen == [(True, True), (False, False)]


@pytest.mark.parametrize(
    ("loc", "scale", "c"), [(0.0, 1e-300, 1.0), (1e308, 1.0, 1.0), (0.0, 1e308, 1e-300)]
)
def test_statistics_a_source_sends_at_the_extremes_leave_every_row_in_the_unit_ball(
    loc, scale, c, monkeypatch
) -> None:
    """Finite, positive statistics the client lets through (``client`` refuses NaN, ∞ and
    values ≤ 0) at the ends of the doubles: the moved rows stay finite and in the unit ball,
    block by block."""
    monkeypatch.setattr(P, "ROW_BLOCK", 5)
    rng = np.random.default_rng(4)
    x = rng.normal(size=(23, 4)) * 50
    terms = SessionTerms(dataset="d", epsilon=8.0, delta=1e-4)  # raw rows: standardized
    view = V.target_view(Domain("t", x, None, 2), "raw", terms=terms)
    moved = view.adopt(np.full(4, loc), np.full(4, scale), c)
    rows = moved.rows()
    assert np.all(np.isfinite(moved.x)) and np.all(np.isfinite(rows))
    assert np.all(np.linalg.norm(rows, axis=1) <= 1 + 1e-9)
    np.testing.assert_array_equal(view.raw, x)  # the table's rows are not written into
