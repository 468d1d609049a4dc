"""Every retry loop's delays: exponential, capped, and jittered in the upper half of a step."""

from __future__ import annotations

import itertools

import pytest

from dpda.service.backoff import backoff


def test_steps_double_up_to_the_cap_and_jitter_stays_in_the_upper_half() -> None:
    low = list(itertools.islice(backoff(0.2, 5.0, uniform=lambda: 0.0), 7))
    high = list(itertools.islice(backoff(0.2, 5.0, uniform=lambda: 1.0), 7))
    steps = [0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    assert low == pytest.approx([s / 2 for s in steps])
    assert high == pytest.approx(steps)


def test_two_clients_retry_at_different_moments() -> None:
    draws = iter([0.1, 0.9])
    a = next(backoff(uniform=lambda: next(draws)))
    b = next(backoff(uniform=lambda: 0.9))
    assert a != b


@pytest.mark.parametrize(("first", "cap"), [(0.0, 5.0), (-1.0, 5.0), (6.0, 5.0)])
def test_a_step_that_cannot_grow_to_its_cap_is_refused(first: float, cap: float) -> None:
    with pytest.raises(ValueError, match="first"):
        next(backoff(first, cap))
