from __future__ import annotations

import numpy as np
import ot
import pytest

from dpda.errors import SolverFailed
from dpda.ot import fast
from dpda.ot.costs import dpot_cost, label_mask, sq_euclidean
from dpda.ot.mapping import barycentric_map
from dpda.ot.solvers import group_lasso_terms, one_hot, sinkhorn, sinkhorn_group_lasso, uniform


def _problem(rng: np.random.Generator, n: int = 60, m: int = 50, q: int = 3):
    xs = rng.normal(size=(n, 4))
    ys = np.sort(rng.integers(0, q, size=n))
    xt = rng.normal(size=(m, 4)) + 0.5
    return xs, ys, xt


def test_sq_euclidean_matches_pot(rng: np.random.Generator) -> None:
    x, _, y = _problem(rng)
    assert np.allclose(sq_euclidean(x, y), ot.dist(x, y))


def test_sinkhorn_marginals_and_nonnegativity(rng: np.random.Generator) -> None:
    xs, _, xt = _problem(rng)
    c = dpot_cost(xs, xt)
    res = sinkhorn(uniform(60), uniform(50), c.normalized, 0.05)
    assert res.converged and res.marginal_error < 1e-3
    assert np.all(res.plan >= 0)
    assert np.allclose(res.plan.sum(1), 1 / 60, atol=1e-4)


def test_group_lasso_matches_pot_reference(rng: np.random.Generator) -> None:
    xs, ys, xt = _problem(rng)
    c = dpot_cost(xs, xt).normalized
    same_start = sinkhorn_group_lasso(
        uniform(60), uniform(50), c, ys, 0.05, 0.5, warm_start=False, engine="pot"
    ).plan
    ref = ot.da.sinkhorn_l1l2_gl(uniform(60), ys, uniform(50), c, 0.05, eta=0.5)
    assert np.abs(same_start - ref).max() < 1e-12  # the same regularizer, the same iterates
    ours = sinkhorn_group_lasso(uniform(60), uniform(50), c, ys, 0.05, 0.5, engine="pot").plan
    f, df = group_lasso_terms(one_hot(ys))

    def objective(g: np.ndarray) -> float:
        return float(np.sum(g * c) + 0.05 * np.sum(g * np.log(g + 1e-300)) + 0.5 * f(g))

    # the warm start (needed for exact masking) lands within 0.1% of POT's objective
    assert abs(objective(ours) - objective(ref)) < 1e-3 * abs(objective(ref))
    assert np.abs(ours - ref).sum() < 0.05  # and moves less than 5% of the mass
    # the regularizer value equals the per-class, per-column norm sum computed slowly
    slow = sum(np.linalg.norm(ours[ys == cl, j]) for cl in range(3) for j in range(50))
    assert f(ours) == pytest.approx(slow)


def test_fast_engine_runs_pots_iterations(rng: np.random.Generator) -> None:
    xs, ys, xt = _problem(rng)
    c = dpot_cost(xs, xt).normalized
    a, b = uniform(60), uniform(50)
    ref = ot.da.sinkhorn_l1l2_gl(a, ys, b, c, 0.05, eta=0.5)
    # float64, POT's start, inner Sinkhorn run to convergence: the same fixed point as POT
    f64, info = fast.group_lasso(
        a, b, c, one_hot(ys), 0.05, 0.5, warm_start=False, dtype=np.float64, inner_stop_thr=1e-14
    )
    assert np.abs(f64 - ref).sum() < 1e-5
    assert info.outer >= 2 and info.inner[0] > info.inner[-1]  # warm-started inner solves
    # the default (float32, entropic start) moves < 1% of the mass relative to POT's engine
    res = sinkhorn_group_lasso(a, b, c, ys, 0.05, 0.5)
    pot = sinkhorn_group_lasso(a, b, c, ys, 0.05, 0.5, engine="pot")
    assert res.plan.dtype == np.float32 and res.converged
    assert 0.5 * np.abs(res.plan - pot.plan).sum() < 0.01
    assert res.transport_cost == pytest.approx(pot.transport_cost, rel=1e-3)


def test_fast_sinkhorn_matches_pot_and_survives_small_reg(rng: np.random.Generator) -> None:
    xs, _, xt = _problem(rng)
    c = dpot_cost(xs, xt).normalized
    a, b = uniform(60), uniform(50)
    ref = ot.sinkhorn(a, b, c, 0.05, stopThr=1e-12, numItermax=10_000)
    assert np.abs(sinkhorn(a, b, c, 0.05).plan - ref).sum() < 1e-4
    # reg 1e-3 on a normalized cost: exp(−C/reg) underflows float32 without the row/column
    # shifts; with them every row still carries its mass
    tight = sinkhorn(a, b, c, 1e-3, max_iter=5000)
    assert np.allclose(tight.plan.sum(1), a, rtol=1e-2)


def test_unknown_engine_is_refused(rng: np.random.Generator) -> None:
    xs, ys, xt = _problem(rng)
    c = dpot_cost(xs, xt).normalized
    with pytest.raises(ValueError, match="engine"):
        sinkhorn_group_lasso(uniform(60), uniform(50), c, ys, 0.05, 0.5, engine="gpu")
    with pytest.raises(ValueError, match="fast engine only"):
        sinkhorn_group_lasso(uniform(60), uniform(50), c, ys, 0.05, 0.5, engine="pot", threads=2)


def test_degenerate_plan_is_an_error_not_a_result(rng: np.random.Generator) -> None:
    xs, _, xt = _problem(rng)
    raw = sq_euclidean(xs * 30, xt * 30)  # unnormalized cost in the hundreds
    with pytest.raises(SolverFailed):
        sinkhorn(uniform(60), uniform(50), raw, 0.01, engine="pot")  # POT's kernel underflows
    # the fast engine's shifted kernel keeps some mass in every row and column, but most entries
    # still underflow float32: the plan cannot be balanced, and the result says so
    res = sinkhorn(uniform(60), uniform(50), raw, 0.01)
    assert not res.converged and res.marginal_error > 1e-3


def test_debiasing_leaves_plan_unchanged(rng: np.random.Generator) -> None:
    xs, ys, xt = _problem(rng)
    a = dpot_cost(xs, xt, noise_std=0.0)
    b = dpot_cost(xs, xt, noise_std=0.7)
    assert np.array_equal(a.normalized, b.normalized)
    assert b.bias == pytest.approx(4 * 0.49)
    assert np.allclose(a.debiased - b.debiased, b.bias)


def test_label_mask_forbids_other_classes(rng: np.random.Generator) -> None:
    xs, ys, xt = _problem(rng)
    known = np.full(50, -1)
    known[:5] = 1
    mask = label_mask(ys, known)
    c = dpot_cost(xs, xt, mask=mask)
    res = sinkhorn_group_lasso(uniform(60), uniform(50), c.normalized, ys, 0.05, 0.5)
    assert res.plan[(ys != 1)][:, :5].max() == 0.0
    assert res.plan[:, :5].sum() == pytest.approx(5 / 50, abs=1e-3)


def test_barycentric_map_identity() -> None:
    xt = np.arange(12.0).reshape(4, 3)
    plan = np.eye(4) / 4
    assert np.allclose(barycentric_map(plan, xt), xt)
    plan2 = np.array([[0.25, 0.25, 0, 0], [0, 0, 0.25, 0.25]])
    assert np.allclose(barycentric_map(plan2, xt), [(xt[0] + xt[1]) / 2, (xt[2] + xt[3]) / 2])


def test_bad_inputs_refused(rng: np.random.Generator) -> None:
    c = np.ones((3, 4))
    with pytest.raises(ValueError):
        sinkhorn(uniform(3), uniform(3), c, 0.1)
    c[0, 0] = np.nan
    with pytest.raises(ValueError):
        sinkhorn(uniform(3), uniform(4), c, 0.1)
