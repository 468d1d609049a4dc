"""Prototypes per (class, cell) (terms ``cells``): the partition is a per-row map drawn
before the rows are read, a record moves at most two of the sums and counts, the charge is
the per-class release's, the noise drawn is the charged noise, and the target reads the
release back as class points and class counts."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from pydantic import ValidationError

from dpda.data.loaders import Domain
from dpda.dp.events import BatchSpec
from dpda.dp.ledger import Budget
from dpda.dp.mechanisms import class_sums, clip_rows, fold_cells, label_counts, row_cells
from dpda.protocol import BatchRelease, TargetDisclosure
from dpda.source_party.batch_draws import draw_rows
from dpda.target_party.fitting import CELL_NOISE_SHARE, aggregate_points, cell_points
from dpda.terms import SessionTerms
from tests.support import memory_releaser
from tests.unit.noise_checks import std_matches

N, DELTA = 900, 1 / 9000


def _terms(**kw: object) -> SessionTerms:
    return SessionTerms(**{"dataset": "d", "epsilon": 8.0, "delta": DELTA, **kw})


def test_a_row_keeps_its_cell_whatever_the_other_rows() -> None:
    """The partition is drawn from the generator alone: the same draw puts every row that two
    neighbouring datasets share in the same cell, and one record moves at most two
    (class, cell) sums, by ≤ C each (2C when it stays in its cell), and two counts by one."""
    c, q, k = 1.3, 3, 4
    rng = np.random.default_rng(5)
    for _ in range(200):
        x = clip_rows(rng.normal(size=(40, 6)) * 2, c)
        y = rng.integers(0, q, size=40)
        x2, y2 = x.copy(), y.copy()
        x2[7] = clip_rows(rng.normal(size=(1, 6)) * 3, c)[0]
        y2[7] = rng.integers(0, q)
        seed = int(rng.integers(1 << 30))
        g = y * k + row_cells(x, k, np.random.default_rng(seed))
        g2 = y2 * k + row_cells(x2, k, np.random.default_rng(seed))
        assert np.array_equal(np.delete(g, 7), np.delete(g2, 7))
        moved = class_sums(x, g, q * k) - class_sums(x2, g2, q * k)
        norm = float(np.linalg.norm(moved))
        assert norm <= (2 * c if g[7] == g2[7] else math.sqrt(2) * c) + 1e-9
        counts = label_counts(g, q * k) - label_counts(g2, q * k)
        assert np.abs(counts).sum() == (0 if g[7] == g2[7] else 2)


def test_cells_cover_every_cell_and_one_cell_is_the_class() -> None:
    rng = np.random.default_rng(2)
    z = rng.normal(size=(5000, 3))
    cells = row_cells(z, 4, rng)
    assert set(np.unique(cells)) == {0, 1, 2, 3}
    assert not np.any(row_cells(z, 1, rng))  # one cell: every row in it, nothing drawn
    assert np.array_equal(fold_cells(np.arange(12), 3), [6, 22, 38])
    assert np.array_equal(fold_cells(np.arange(3), 3), np.arange(3))


def test_cells_are_offered_with_prototypes_only() -> None:
    assert _terms(cells=4).cells == 4
    with pytest.raises(ValidationError, match="cells"):
        _terms(cells=2, release="class-gaussians")
    for bad in (0, 17, -1):
        with pytest.raises(ValidationError, match="cells"):
            _terms(cells=bad)


def test_the_charge_and_the_noise_are_the_per_class_release_s() -> None:
    """Same plan, same ledger charge with and without cells; the release carries one sum and
    one count per (class, cell); on rows of zeros (every sum exactly 0) the values drawn are
    the noise alone, and its scale is the charged σ."""
    rng = np.random.default_rng(3)
    y = rng.integers(0, 3, size=N)
    dom = Domain("d", rng.normal(size=(N, 5)) * 2, y, 3)
    got = []
    for cells in (1, 4):
        src, ledger = memory_releaser(dom, "d", Budget(100.0, DELTA), np.random.default_rng(9))
        info = src.open_session(_terms(cells=cells), TargetDisclosure(None, None))
        rel = src.release(info.session_id, 0)
        got.append((rel, ledger.store.entries("d")[-1]))
    (one, e1), (four, e4) = got
    assert one.spec == four.spec and e1.dp_event == e4.dp_event
    assert one.z.shape == (3, 5) and four.z.shape == (12, 5)
    assert four.noisy_counts.shape == (12,)
    assert fold_cells(four.noisy_counts, 3).shape == (3,)

    zeros = Domain("d", np.zeros((N, 5)), y, 3)
    src, ledger = memory_releaser(zeros, "d", Budget(100.0, DELTA), np.random.default_rng(4))
    terms = _terms(cells=4)
    info = src.open_session(terms, TargetDisclosure(None, None))
    first = src.release(info.session_id, 0)
    entry, live = ledger.store.entries("d")[-1], src.live(info.session_id)
    x = src.features(info.session_id)
    draws = [first.z] + [
        draw_rows(x, y, terms, first.spec, info, 0, entry, live.noise).z for _ in range(250)
    ]
    assert isinstance(first.spec, BatchSpec)
    assert std_matches(np.concatenate([d.ravel() for d in draws]), first.spec.features.noise_std)


def test_cell_points_keep_large_cells_and_pool_the_small() -> None:
    """Cells with enough rows for their noise are points of their own; a class's small cells
    are pooled into one mean; each point weighs its noisy count; a class with no rows is left
    out."""
    ell, q, k = 2, 3, 3
    means = np.arange(q * k * ell, dtype=float).reshape(q * k, ell)
    counts = np.array([[50, 40, 2], [3, 1, 0], [0, 0, 0]])
    sums = means * counts.reshape(-1, 1)
    rel = BatchRelease(0, sums, counts.ravel(), _spec(std=1.5), 0)
    least = 1.5 * math.sqrt(ell) / CELL_NOISE_SHARE
    assert 3 < least < 40
    pts, labels, w = cell_points(rel, q, 1.0)
    assert labels.tolist() == [0, 0, 0, 1]
    assert np.allclose(pts[:3], means[[0, 1, 2]])  # class 0: two cells of their own, one pooled
    assert np.allclose(pts[3], (3 * means[3] + means[4]) / 4)  # class 1: all pooled
    assert np.allclose(w, np.array([50, 40, 2, 4]) / 96)
    # aggregate_points reads a (class, cell) release through it
    got = aggregate_points(rel, "prototypes", q, 0, 10)
    assert np.allclose(got[0], pts) and np.array_equal(got[1], labels)


def _spec(std: float) -> BatchSpec:
    terms = _terms(cells=3)
    src, _ = memory_releaser(
        Domain("d", np.ones((30, 2)), np.arange(30) % 3, 3), "d", Budget(100.0, DELTA)
    )
    spec = src.open_session(terms, TargetDisclosure(None, None)).plan.spec(terms)
    assert isinstance(spec, BatchSpec)
    f = spec.features
    return replace(spec, features=replace(f, noise_multiplier=std / f.sensitivity))


@pytest.mark.slow  # a whole rehearsal: the README's test command runs it
def test_a_rehearsal_with_cells_fits_several_points_a_class_and_reports_class_counts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The job end to end on a pair whose classes are made of several clusters: the release
    holds q × cells sums and counts, the fits transport more than one point for some class,
    and every figure the job reports per class (the noisy counts, the choice's count score)
    is per class."""
    import dpda.target_party.fitting as fitting
    from dpda.data.devsuite import pair
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig

    seen: list[np.ndarray] = []

    def spy(rel: BatchRelease, n_classes: int, clip_norm: float):  # type: ignore[no-untyped-def]
        got = cell_points(rel, n_classes, clip_norm)
        seen.append(got[1])
        return got

    monkeypatch.setattr(fitting, "cell_points", spy)
    s, t = pair("skada-covariate", 0)
    terms = SessionTerms(dataset="source", epsilon=8.0, delta=1e-4, cells=3)
    out = simulate(s, t, terms, "raw", AdaptConfig(seed=0), seed=0, scaling_mode="auto")
    q = s.n_classes
    fitted = out.dpda
    assert fitted.accuracy is not None and 0 <= fitted.accuracy <= 100
    data = out.to_json(terms)
    assert data["epsilon_spent"] <= 8.0 + 1e-9
    assert all(len(c) == q for c in fitted.noisy_counts)
    arms = data["choice"]["arms"]
    assert arms and all(0 <= a["scores"]["counts"] <= 1 for a in arms if a["scores"])
    assert seen and all(np.bincount(labels).max() > 1 for labels in seen)


def test_the_job_asks_for_the_most_cells_the_source_s_rows_per_class_leave_precise(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Left out, ``cells`` follows the source's published size and the release's σ: the
    largest K ≤ AUTO_CELLS whose cell means keep noise σ·√k·q·K / n ≤ AUTO_CELL_NOISE; a
    source with few rows a class in many columns, or a small ε, gets one."""
    import dpda.target_party.view as view
    from dpda.planner import plan_batches
    from dpda.target_party.view import auto_cells
    from dpda.terms import AUTO_CELL_NOISE

    AUTO_CELLS = 3  # the rule's machinery, at the bound it was measured with
    monkeypatch.setattr(view, "AUTO_CELLS", AUTO_CELLS)

    terms = _terms(preprocessing="standardize", clip_norm=1.0)
    std = plan_batches(terms, 2000, np.eye(20)).spec(terms).features.noise_std
    for n, q, k in ((2000, 4, 20), (89, 3, 13), (75, 3, 4), (720, 20, 1024), (50, 10, 300)):
        per_cell = std * math.sqrt(k) * q / n
        want = max(
            [c for c in range(1, AUTO_CELLS + 1) if c == 1 or per_cell * c <= AUTO_CELL_NOISE]
        )
        assert auto_cells(terms, n, q, k) == want
    assert auto_cells(terms, 2000, 4, 20) == AUTO_CELLS  # many rows a class: every cell
    assert auto_cells(terms, 720, 20, 1024) == 1  # 36 rows a class in 1,024 columns
    assert auto_cells(_terms(epsilon=0.5, preprocessing="standardize"), 75, 3, 4) == 1
    assert auto_cells(terms, 0, 3, 4) == 1


def test_cells_follow_the_rule_only_where_the_job_leaves_them_out_on_standardized_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rule runs for source-space prototypes on raw rows the source standardizes; a job
    that names ``cells`` gets what it names, and other representations keep one cell."""
    import dpda.target_party.view as view
    from dpda.data.devsuite import pair
    from dpda.target_party.view import AdaptConfig, session_terms, target_view

    monkeypatch.setattr(view, "AUTO_CELLS", 3)  # the rule's machinery, at its measured bound
    s, _ = pair("classification", 0)
    size = (s.x.shape[0], s.n_classes)
    raw = target_view(s, "raw", scaling_mode="uniform")
    auto, _ = session_terms(raw, _terms(), AdaptConfig(seed=0), size)
    assert auto.preprocessing == "standardize" and auto.cells == 3
    named, _ = session_terms(raw, _terms(cells=2), AdaptConfig(seed=0), size)
    assert named.cells == 2
    unknown, _ = session_terms(raw, _terms(), AdaptConfig(seed=0))  # no size published
    assert unknown.cells == 1
    positive = Domain("d", np.abs(s.x), s.y, s.n_classes)
    sqrt = target_view(positive, "sqrt", scaling_mode="uniform")
    kept, _ = session_terms(sqrt, _terms(), AdaptConfig(seed=0), size)
    assert kept.preprocessing == "none" and kept.cells == 1
