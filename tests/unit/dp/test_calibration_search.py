"""The two searches every calibration goes through: ``smallest_scale`` (noise scales) and
``largest_count`` (numbers of steps). Whatever the monotone spend, the value returned is one the
search checked and found within ε; what it could not compute is never taken as met."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpda.dp.calibration import StepsTooLarge, largest_count, smallest_scale
from dpda.dp.work_bounds import PlanTooLarge


@settings(max_examples=200, deadline=None)
@given(
    scale=st.floats(1e-2, 1e4),
    power=st.floats(0.3, 3.0),
    epsilon=st.floats(0.05, 50.0),
    start=st.floats(1e-3, 1e5),
    tol=st.sampled_from([1e-4, 1e-3, 1e-2]),
    unbounded_below=st.floats(0.0, 1e3),
)
def test_smallest_scale_returns_only_a_checked_scale_that_meets_epsilon(
    scale: float, power: float, epsilon: float, start: float, tol: float, unbounded_below: float
) -> None:
    checked: dict[float, float] = {}

    def spend(s: float) -> float:
        # a falling spend; below ``unbounded_below`` its composition is "too large" (∞)
        value = math.inf if s < unbounded_below else (scale / s) ** power
        checked[s] = value
        return value

    try:
        s = smallest_scale(spend, epsilon, start, 0.05, tol)
    except ValueError:  # no scale up to the ceiling meets ε
        assert (scale / 1e6) ** power > epsilon or unbounded_below > 1e6
        return
    assert s in checked and checked[s] <= epsilon
    true_root = max(scale * epsilon ** (-1 / power), unbounded_below)
    assert s >= true_root * (1 - 1e-12)
    if checked[s] < (1 - tol) * epsilon:
        # it stopped short of (1 − tol)·ε only on a bracket 1e-6 wide, or where its next step
        # down passed the floor (more noise than needed: the safe side)
        below = [x for x, v in checked.items() if x < s and v > epsilon]
        assert (below and s - max(below) <= 1e-6 * s * 1.000001) or not below


@settings(max_examples=200, deadline=None)
@given(limit=st.integers(0, 5_000_000), cap=st.integers(1, 10_000_000))
def test_largest_count_returns_a_checked_count_and_never_one_past_the_limit(
    limit: int, cap: int
) -> None:
    checked: set[int] = set()

    def ok(t: int) -> bool:
        checked.add(t)
        return t <= limit

    t = largest_count(ok, cap)
    assert t <= limit and (t == 0 or t in checked)
    # the largest such count, unless the doubling passed the cap first
    assert t == limit or 2 * t > cap


def test_a_count_that_cannot_be_computed_is_not_called_met() -> None:
    def ok(t: int) -> bool:
        if t > 40:
            raise PlanTooLarge("too large")
        return t <= 1000

    with pytest.raises(StepsTooLarge) as err:
        largest_count(ok)
    assert err.value.at_least <= 40 < err.value.too_large
