"""Enforced non-negative rows (terms ``nonnegative_rows``): the √2·C same-label bound, its
charge, the noise drawn against it, the clamp on hostile values, and who asks for it."""

from __future__ import annotations

import math

import numpy as np
import pytest
from pydantic import ValidationError

from dpda.data.loaders import Domain
from dpda.dp.events import event_from_json
from dpda.dp.ledger import Budget, spend_of
from dpda.dp.mechanisms import (
    aggregate_sensitivity,
    class_gaussians_sensitivity,
    clip_rows,
    nonnegative_rows,
)
from dpda.planner import plan_batches
from dpda.protocol import TargetDisclosure
from dpda.terms import SessionTerms
from tests.support import memory_releaser
from tests.unit.noise_checks import std_matches

N, DELTA = 1123, 1 / (10 * 1123)


def _terms(release: str = "prototypes", **kw: object) -> SessionTerms:
    return SessionTerms(dataset="d", epsilon=8.0, delta=DELTA, release=release, **kw)


def test_the_same_label_bound_of_non_negative_rows_is_root_two_c() -> None:
    """√2·C: no pair of non-negative rows of norm ≤ C is further apart, and two orthogonal
    ones reach it; without the clamp a row and its opposite reach 2C."""
    c = 1.7
    assert aggregate_sensitivity("replace-one", c, nonnegative=True) == pytest.approx(
        math.sqrt(2) * c
    )
    assert aggregate_sensitivity("replace-one", c) == 2 * c
    assert aggregate_sensitivity("add-remove", c, nonnegative=True) == c
    rng = np.random.default_rng(0)
    x = clip_rows(nonnegative_rows(rng.normal(size=(20_000, 5)) * 3), c)
    x2 = clip_rows(nonnegative_rows(rng.normal(size=(20_000, 5)) * 3), c)
    moves = np.linalg.norm(x - x2, axis=1)
    assert moves.max() <= math.sqrt(2) * c + 1e-12
    assert moves.max() >= 0.99 * math.sqrt(2) * c  # reached: the bound is not loose
    assert np.linalg.norm(c * np.eye(5)[0] - c * np.eye(5)[1]) == pytest.approx(math.sqrt(2) * c)


def test_the_class_gaussians_block_of_non_negative_rows_moves_by_at_most_two() -> None:
    """‖u − v‖² + ‖u∘u − v∘v‖² ≤ 4 over non-negative u, v in the unit ball (the proof in
    ``class_gaussians_sensitivity``), reached at u = e₁, v = e₂; 3/√2 without the clamp."""
    assert class_gaussians_sensitivity("replace-one", nonnegative=True) == 2.0
    assert class_gaussians_sensitivity("replace-one", label_change=True, nonnegative=True) == 2.0
    rng = np.random.default_rng(1)
    u = np.abs(rng.normal(size=(40_000, 4)))
    v = np.abs(rng.normal(size=(40_000, 4)))
    u /= np.linalg.norm(u, axis=1, keepdims=True) * rng.uniform(1, 1.3, size=(40_000, 1))
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    # sparse corners too, where the maximum sits
    u[:4], v[:4] = np.eye(4), np.roll(np.eye(4), 1, axis=0)
    moves = np.sum((u - v) ** 2, 1) + np.sum((u * u - v * v) ** 2, 1)
    assert moves.max() <= 4.0 + 1e-12
    assert moves.max() == pytest.approx(4.0)


@pytest.mark.parametrize("release", ["prototypes", "class-gaussians"])
def test_the_plan_charges_the_smaller_bound_and_spends_what_is_granted(release: str) -> None:
    """The plan uses the smaller same-label bound (the label-change one is unchanged), spends
    between 0.99 ε and ε, and needs less noise per coordinate than without the clamp."""
    on, off = _terms(release, nonnegative_rows=True), _terms(release)
    p_on, p_off = plan_batches(on, N, np.eye(30)), plan_batches(off, N, np.eye(30))
    same = math.sqrt(2) if release == "prototypes" else 2.0
    assert p_on.feature_sensitivity == pytest.approx(same)
    assert p_on.feature_label_change_sensitivity == pytest.approx(
        p_off.feature_label_change_sensitivity, rel=1e-15
    )
    spent = spend_of(p_on.events(on), DELTA)
    assert 0.99 * on.epsilon <= spent <= on.epsilon
    std_on = p_on.feature_noise_multiplier * p_on.feature_sensitivity
    std_off = p_off.feature_noise_multiplier * p_off.feature_sensitivity
    # prototypes: 26% less noise at ε = 8; class-gaussians, whose label-change branch (2,
    # unchanged) is already close to the same-label one, 1.5%
    assert std_on < (0.8 if release == "prototypes" else 0.99) * std_off


def test_the_terms_refuse_the_clamp_where_rows_are_projected() -> None:
    with pytest.raises(ValidationError, match="nonnegative_rows"):
        _terms(projection="target-pca", nonnegative_rows=True)


def _released(x: np.ndarray, y: np.ndarray, q: int, release: str = "prototypes"):
    rel, ledger = memory_releaser(
        Domain("d", x, y, q), "d", Budget(100, 1e-5), np.random.default_rng(5)
    )
    terms = SessionTerms(
        dataset="d", epsilon=4.0, delta=1e-5, release=release, nonnegative_rows=True
    )
    info = rel.open_session(terms, TargetDisclosure(None, None))
    return rel.release(info.session_id, 0), ledger.store.entries("d")[-1]


def test_the_noise_drawn_is_the_ledgers_claim() -> None:
    """All-zero rows: every released sum is noise, with the std σ·√2·C the entry records."""
    q = 600
    b, entry = _released(np.zeros((1200, 30)), np.arange(1200) % q, q)
    f = entry.params["spec"]["features"]
    assert entry.params["nonnegative_rows"] is True
    assert f["sensitivity"] == pytest.approx(math.sqrt(2))
    assert event_from_json(entry.dp_event) is not None
    claimed = f["noise_multiplier"] * f["sensitivity"]
    assert std_matches(b.z, claimed)
    assert not std_matches(b.z, claimed * 0.7)
    assert not std_matches(b.z, claimed * 1.3)


def test_hostile_values_are_clamped_into_the_orthant_and_the_ball() -> None:
    """NaN, ±inf, ±1e308 and 1e-300 in the source's rows: each row is made finite (a row with a
    non-finite entry is the zero row), clamped at 0 and clipped, so every row is in the
    orthant and the ball whatever the values; the release stays finite."""
    x = np.array(
        [
            [np.nan, 1.0, 0.0],
            [np.inf, 0.0, 1.0],
            [-np.inf, 2.0, 0.0],
            [1e308, 1e308, -1e308],
            [1e-300, -1e-300, 0.0],
            [-5.0, -1.0, -2.0],
        ]
    )
    z = clip_rows(nonnegative_rows(x), 1.0)
    assert np.all(np.isfinite(z)) and np.all(z >= 0)
    assert np.all(np.linalg.norm(z, axis=1) <= 1.0 + 1e-12)
    assert np.all(z[:3] == 0.0) and np.all(z[5] == 0.0)
    b, _ = _released(x, np.array([0, 1, 0, 1, 0, 1]), 2)
    assert np.all(np.isfinite(b.z))


def test_the_target_asks_for_it_where_the_representation_is_non_negative() -> None:
    """A source-space job on √-rows asks for the clamp (a no-op on them); on raw rows it does
    not unless the terms say so."""
    from dpda.target_party.view import AdaptConfig, session_terms, target_view

    rng = np.random.default_rng(2)
    dom = Domain("t", np.abs(rng.normal(size=(40, 6))), None, 2)
    base = SessionTerms(dataset="d", epsilon=8.0, delta=DELTA)
    for rep, expected in (("sqrt", True), ("raw", False), ("l2", False)):
        view = target_view(dom, rep, terms=base)
        asked, _ = session_terms(view, base, AdaptConfig())
        assert asked.nonnegative_rows is expected
    explicit = SessionTerms(dataset="d", epsilon=8.0, delta=DELTA, nonnegative_rows=False)
    asked, _ = session_terms(target_view(dom, "sqrt", terms=explicit), explicit, AdaptConfig())
    assert asked.nonnegative_rows is False
