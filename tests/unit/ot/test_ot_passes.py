"""The blocked group-lasso solver: what it counts, its warm start, its independence of threads."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dpda.ot import fast
from dpda.ot._blocked import BLOCK_ELEMS
from dpda.ot.costs import dpot_cost
from dpda.ot.solvers import one_hot, sinkhorn_group_lasso, uniform
from dpda.ot.traffic import Traffic


def _batch(rng: np.random.Generator, xt: np.ndarray, n: int = 80, q: int = 3):
    """A minibatch of labeled source points (sorted by label, as a release's rows are)."""
    ys = np.sort(rng.integers(0, q, size=n))
    xs = rng.normal(size=(n, xt.shape[1])) + ys[:, None] * 0.8
    return dpot_cost(xs, xt).normalized, ys


def _mass_moved(p: np.ndarray, r: np.ndarray) -> float:
    return float(0.5 * np.abs(p.astype(np.float64) - r).sum())


def test_counts_are_the_passes_the_solver_made(rng: np.random.Generator) -> None:
    xt = rng.normal(size=(70, 4))
    c, ys = _batch(rng, xt)
    plan, info = fast.group_lasso(uniform(80), uniform(70), c, one_hot(ys), 0.05, 0.5)
    t = info.traffic
    assert t.passes == sum(info.inner)  # one pass over the kernel per Sinkhorn iteration
    assert t.kernel_builds == info.outer + 1  # the entropic start, then one per outer step
    # besides its passes the solve reads a few plan-sized arrays per kernel build, no more
    assert t.passes * plan.nbytes < t.bytes_read < (t.passes + 8 * t.kernel_builds) * plan.nbytes
    assert info.rows is not None and np.allclose(info.rows, plan.sum(axis=1), atol=1e-7)
    assert info.cost == pytest.approx(float(np.sum(plan * c, dtype=np.float64)), rel=1e-5)


def test_warm_start_from_another_batch_is_the_same_plan_in_fewer_passes(
    rng: np.random.Generator,
) -> None:
    xt = rng.normal(size=(70, 4))
    first, ys1 = _batch(rng, xt)
    c, ys = _batch(rng, xt)
    _, info1 = fast.group_lasso(uniform(80), uniform(70), first, one_hot(ys1), 0.02, 0.5)
    assert info1.start_state is not None and info1.start_state.beta.shape == (70,)
    cold, ci = fast.group_lasso(uniform(80), uniform(70), c, one_hot(ys), 0.02, 0.5)
    warm, wi = fast.group_lasso(
        uniform(80), uniform(70), c, one_hot(ys), 0.02, 0.5, start=info1.start_state
    )
    assert wi.inner[0] < ci.inner[0]  # the first solve starts near its fixed point
    assert _mass_moved(warm, cold) < 1e-4  # and reaches the same one


def test_a_column_the_warm_start_drowns_is_shifted_back(rng: np.random.Generator) -> None:
    """Potentials far off for one column underflow it in float32; the build shifts it back."""
    xt = rng.normal(size=(70, 4))
    c, ys = _batch(rng, xt)
    cold, _ = fast.group_lasso(uniform(80), uniform(70), c, one_hot(ys), 0.02, 0.5)
    beta = np.zeros(70)
    beta[5] = -50.0  # exp(−50 / 0.02): far below float32's smallest number
    bad = fast.SinkhornState(np.zeros(80), beta)
    plan, info = fast.group_lasso(uniform(80), uniform(70), c, one_hot(ys), 0.02, 0.5, start=bad)
    assert plan[:, 5].sum() == pytest.approx(1 / 70, rel=1e-3)
    assert _mass_moved(plan, cold) < 1e-4 and info.marginal_error < 1e-4


def test_plan_is_the_same_bit_for_bit_on_one_thread_or_two(
    rng: np.random.Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One thread, two threads in a pool, or two threads' spans run in the calling thread (a
    plan below ``POOL_MIN_CELLS``): the same spans summed in the same order, the same plan."""
    m = 300  # several blocks of rows per span
    rows = max(1, BLOCK_ELEMS // m)
    n = 9 * rows // 2 if rows < 200 else 200
    xt = rng.normal(size=(m, 4))
    c, ys = _batch(rng, xt, n=n)
    one, _ = fast.group_lasso(uniform(n), uniform(m), c, one_hot(ys), 0.05, 0.5, threads=1)
    one = one.copy()
    monkeypatch.setattr(fast, "POOL_MIN_CELLS", 0)  # every solve in a pool
    two, _ = fast.group_lasso(uniform(n), uniform(m), c, one_hot(ys), 0.05, 0.5, threads=2)
    two = two.copy()
    monkeypatch.setattr(fast, "POOL_MIN_CELLS", n * m + 1)  # this one in the calling thread
    here, _ = fast.group_lasso(uniform(n), uniform(m), c, one_hot(ys), 0.05, 0.5, threads=2)
    assert np.array_equal(one, two) and np.array_equal(one, here)


def test_inner_tolerance_keeps_the_plan_and_its_convergence(rng: np.random.Generator) -> None:
    xt = rng.normal(size=(70, 4))
    c, ys = _batch(rng, xt)
    tight = sinkhorn_group_lasso(uniform(80), uniform(70), c, ys, 0.02, 0.5)
    loose = sinkhorn_group_lasso(uniform(80), uniform(70), c, ys, 0.02, 0.5, inner_tol=2.5e-4)
    assert loose.converged and loose.marginal_error < 1e-3
    assert loose.traffic.passes < tight.traffic.passes
    assert _mass_moved(loose.plan, tight.plan.astype(np.float64)) < 2e-3


def test_rows_in_any_label_order_are_solved_as_the_same_problem(
    rng: np.random.Generator,
) -> None:
    """Rows whose labels are not sorted (a USPS source, a random subset) get the plan of the
    same rows sorted, row for row, and the solver's class masses and row sums are those of the
    plan it returns; POT's solver, which takes rows in any order, agrees."""
    xt = rng.normal(size=(60, 4))
    c, ys = _batch(rng, xt, n=50)
    shuffle = rng.permutation(50)
    mixed = sinkhorn_group_lasso(uniform(50), uniform(60), c[shuffle], ys[shuffle], 0.05, 0.5)
    ordered = sinkhorn_group_lasso(uniform(50), uniform(60), c, ys, 0.05, 0.5)
    # the same plan up to the order of float32 sums (rows of a class are summed in another order)
    assert np.allclose(mixed.plan, ordered.plan[shuffle], rtol=1e-4, atol=1e-9)
    plan = mixed.plan.astype(np.float64)
    assert mixed.class_mass is not None and mixed.rows is not None
    assert np.allclose(mixed.class_mass, one_hot(ys[shuffle]).T @ plan, atol=1e-8)
    assert np.allclose(mixed.rows, plan.sum(axis=1), atol=1e-8)
    pot = sinkhorn_group_lasso(
        uniform(50), uniform(60), c[shuffle], ys[shuffle], 0.05, 0.5, engine="pot"
    )
    assert _mass_moved(mixed.plan, pot.plan) < 1e-3


def test_a_workspace_gives_the_plans_of_fresh_buffers(rng: np.random.Generator) -> None:
    """Solves of different batch sizes through one workspace return the plans that fresh
    buffers give, and a smaller batch reuses the larger one's buffers."""
    xt = rng.normal(size=(40, 4))
    big, ys_big = _batch(rng, xt, n=60)
    small, ys_small = _batch(rng, xt, n=50)
    ws = fast.Workspace()
    first = sinkhorn_group_lasso(uniform(60), uniform(40), big, ys_big, 0.05, 0.5, workspace=ws)
    kept = first.plan.copy()
    held = ws.nbytes()
    second = sinkhorn_group_lasso(
        uniform(50), uniform(40), small, ys_small, 0.05, 0.5, workspace=ws
    )
    assert ws.nbytes() == held  # the 50-row solve fits in the 60-row buffers
    alone = sinkhorn_group_lasso(uniform(50), uniform(40), small, ys_small, 0.05, 0.5)
    again = sinkhorn_group_lasso(uniform(60), uniform(40), big, ys_big, 0.05, 0.5)
    assert np.array_equal(second.plan, alone.plan)
    assert np.array_equal(kept, again.plan)


def test_the_outer_loop_stops_when_the_objective_settles_not_after_a_short_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After its first long step the line search often takes a short one whose small change
    is followed by a large one: the loop stops only when a change is below ``stop_thr`` and the
    one before it below ten times that."""
    from dpda.data.synthetic import two_domains

    changes: list[float] = []
    search = fast._line_search

    def recorded(loss: float, *args: Any) -> tuple[float, float]:
        alpha, new = search(loss, *args)
        changes.append(abs(loss - new) / abs(new))
        return alpha, new

    monkeypatch.setattr(fast, "_line_search", recorded)
    src, tgt = two_domains(500, 500, seed=0)
    order = np.argsort(src.y, kind="stable")
    cost = dpot_cost(src.x[order], tgt.x).normalized
    tol = 6e-3
    _, info = fast.group_lasso(
        uniform(500), uniform(500), cost, one_hot(src.y[order]), 0.02, 0.5, stop_thr=tol
    )
    assert changes[1] < tol < changes[2]  # a short step's small change, then a large one
    assert info.outer == len(changes) > 2 and info.outer < 10
    assert changes[-1] < tol and changes[-2] < 10 * tol
    earlier = zip(changes[:-2], changes[1:-1], strict=True)
    assert all(not (c < tol and p < 10 * tol) for p, c in earlier)  # no earlier stop


def test_span_class_tables_cover_only_their_classes_and_sum_as_whole_tables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One point a class (prototypes): each span's (q, m) sums hold only its own classes' rows,
    and the gathered tables are the plan's Yᵀγ, the same on one thread or several."""
    from dpda.ot import _blocked, fast
    from dpda.ot.fast import group_lasso

    monkeypatch.setattr(fast, "POOL_MIN_CELLS", 0)  # the spans in a pool of three threads

    rng = np.random.default_rng(5)
    n, m = 10, 3000
    y = np.eye(n)
    cost = rng.random((n, m)).astype(np.float32)
    a, b = np.full(n, 1 / n), np.full(m, 1 / m)
    one, info1 = group_lasso(a, b, cost, y, 0.05, 0.5, threads=1)
    one = one.copy()
    many, info3 = group_lasso(a, b, cost, y, 0.05, 0.5, threads=3)
    np.testing.assert_array_equal(one, many)
    np.testing.assert_array_equal(info1.class_mass, info3.class_mass)
    np.testing.assert_allclose(info1.class_mass, one.astype(np.float64), rtol=1e-6, atol=1e-12)
    layout = _blocked.rows_for(n, m, 3, np.arange(n))
    assert [_blocked._classes(layout, lo, hi)[1] for lo, hi in layout.spans()] == [
        hi - lo for lo, hi in layout.spans()
    ]


def test_traffic_adds_field_by_field_and_a_job_counts_its_fits() -> None:
    one = Traffic(kernel_builds=2, passes=30, bytes_read=900, pass_bytes=600, fits=1, seconds=0.5)
    two = one + one + Traffic()
    assert two == Traffic(4, 60, 1800, 1200, 2, 1.0)
    per = two.to_json()
    assert per["fits"] == 2 and per["passes_per_fit"] == 30 and per["read_over_pass_bytes"] == 1.5
    with pytest.raises(AttributeError):  # a value: summed with +, never changed in place
        one.passes = 0  # type: ignore[misc]
