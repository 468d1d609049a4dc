"""Revealed Poisson sampling under the attribute relation (``RevealedSampledGaussianDpEvent``).

Neighbours differ in one feature of one record, which is in both datasets: whether the record
is sampled is revealed, so sampling scales δ and does not amplify ε. The exact profile of T
steps is

    δ(ε) = Σ_K Bin(K; T, p) · δ_Gauss(ε; √K/σ),
    δ_Gauss(ε; μ) = Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2),

computed here independently with scipy and inverted by bisection; the ledger's PLD must be an
upper bound on it and tight.
"""

from __future__ import annotations

import json
import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dpda.dp.accountants import revealed_sampled_gaussian_rdp
from dpda.dp.accounting import (
    LEDGER_PLD_INTERVAL,
    epsilon_of,
    revealed_sampled_epsilon,
    sampled_gaussian_epsilon,
)
from dpda.dp.calibration import max_revealed_steps, revealed_sigma_for_epsilon
from dpda.dp.events import (
    RevealedSampledGaussianDpEvent,
    canonical_json,
    event_from_json,
    event_to_json,
)
from dpda.dp.ledger import canonical_events


# ---------------------------------------------------------------- exact closed form (scipy)
def exact_delta(eps: float, sigma: float, p: float, steps: int) -> float:
    k = np.arange(1, steps + 1)
    weights = stats.binom.pmf(k, steps, p)
    mu = np.sqrt(k) / sigma
    d_gauss = stats.norm.cdf(-eps / mu + mu / 2) - np.exp(
        eps + stats.norm.logcdf(-eps / mu - mu / 2)
    )
    return float(np.dot(weights, np.maximum(d_gauss, 0.0)))


def exact_epsilon(sigma: float, p: float, steps: int, delta: float) -> float:
    """Root of δ(ε) = delta by bisection (δ is decreasing in ε); returns the upper end."""
    lo, hi = 0.0, 1.0
    while exact_delta(hi, sigma, p, steps) > delta:
        lo, hi = hi, 2 * hi
    for _ in range(100):
        mid = 0.5 * (lo + hi)
        if exact_delta(mid, sigma, p, steps) > delta:
            lo = mid
        else:
            hi = mid
    return hi


def revealed(sigma: float, p: float, steps: int) -> dp_event.DpEvent:
    return dp_event.SelfComposedDpEvent(RevealedSampledGaussianDpEvent(sigma, p), steps)


def amplified(sigma: float, p: float, steps: int) -> dp_event.DpEvent:
    return dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(sigma)), steps
    )


# ---------------------------------------------------------------- (a) PLD vs exact
CASES = [
    # (σ, p, T, δ)
    (1.1, 128 / 1123, 64, 1 / (1.2 * 1123)),  # the small job: exact ε = 12.443
    (1.1, 1000 / 150000, 150, 1 / (1.2 * 150000)),  # VisDA scale: exact ε = 7.970
    (1.0, 0.01, 1000, 1e-5),
    (3.0, 0.05, 50, 1e-6),
    (5.0, 0.2, 20, 1e-5),
    (10.0, 0.01, 100, 1e-5),
    (0.5, 0.001, 10, 1e-3),
]


@pytest.mark.parametrize("sigma,p,steps,delta", CASES)
def test_pld_is_a_tight_upper_bound_on_the_exact_epsilon(
    sigma: float, p: float, steps: int, delta: float
) -> None:
    exact = exact_epsilon(sigma, p, steps, delta)
    pld = epsilon_of([revealed(sigma, p, steps)], delta, "pld", LEDGER_PLD_INTERVAL)
    assert pld >= exact * (1 - 1e-12)  # pessimistic: never below the truth
    assert pld <= exact * (1 + 1e-3)  # and tight (measured ≤ 1e-5 relative at 1e-3)
    # RDP is an upper bound too (looser).
    assert epsilon_of([revealed(sigma, p, steps)], delta, "rdp") >= pld - 1e-9


@pytest.mark.parametrize(
    "sigma,p,steps,delta,expected",
    [
        (1.1, 128 / 1123, 64, 1 / (1.2 * 1123), 12.443),
        (1.1, 1000 / 150000, 150, 1 / (1.2 * 150000), 7.970),
    ],
)
def test_reported_figures(
    sigma: float, p: float, steps: int, delta: float, expected: float
) -> None:
    assert exact_epsilon(sigma, p, steps, delta) == pytest.approx(expected, abs=5e-4)
    assert revealed_sampled_epsilon(sigma, p, steps, delta) == pytest.approx(expected, abs=5e-4)


# ---------------------------------------------------------------- (b) vs amplification, p = 1
@pytest.mark.parametrize("sigma,p,steps,delta", CASES[:4])
def test_revealed_charge_is_at_least_the_amplified_charge(
    sigma: float, p: float, steps: int, delta: float
) -> None:
    for acc in ("pld", "rdp"):
        rev = epsilon_of([revealed(sigma, p, steps)], delta, acc, LEDGER_PLD_INTERVAL)
        amp = epsilon_of([amplified(sigma, p, steps)], delta, acc, LEDGER_PLD_INTERVAL)
        assert rev >= amp


@pytest.mark.slow
@pytest.mark.parametrize("sigma,steps", [(1.0, 1), (1.1, 64), (3.0, 7)])
def test_p_equal_one_is_the_plain_gaussian(sigma: float, steps: int) -> None:
    plain = dp_event.GaussianDpEvent(sigma / math.sqrt(steps))  # T Gaussians = one Gaussian
    for acc in ("pld", "rdp"):
        assert epsilon_of(
            [revealed(sigma, 1.0, steps)], 1e-5, acc, LEDGER_PLD_INTERVAL
        ) == pytest.approx(epsilon_of([plain], 1e-5, acc, LEDGER_PLD_INTERVAL), rel=1e-9)
    assert revealed_sampled_epsilon(sigma, 1.0, steps, 1e-5) == pytest.approx(
        exact_epsilon(sigma, 1.0, steps, 1e-5), rel=1e-3
    )


def test_rdp_closed_form() -> None:
    orders = np.array([1.5, 2.0, 8.0, 64.0, 1024.0])
    # p = 1: the Gaussian's α/(2σ²); large orders must not overflow (warnings are errors).
    assert revealed_sampled_gaussian_rdp(2.0, 1.0, orders) == pytest.approx(orders / 8.0)
    p, sigma = 0.01, 1.3
    direct = np.log(1 - p + p * np.exp(orders[:3] * (orders[:3] - 1) / (2 * sigma**2)))
    assert revealed_sampled_gaussian_rdp(sigma, p, orders)[:3] == pytest.approx(
        direct / (orders[:3] - 1), rel=1e-12
    )
    big = revealed_sampled_gaussian_rdp(0.5, 1e-3, orders)
    assert np.all(np.isfinite(big)) and np.all(np.diff(big) > 0)
    with pytest.raises(ValueError):
        revealed_sampled_gaussian_rdp(1.0, 0.5, [1.0])


# ---------------------------------------------------------------- (c) tiny p: δ scaled, ε kept
def test_tiny_p_tends_to_a_gaussian_at_scaled_delta_not_to_zero() -> None:
    sigma, steps, d_gauss = 1.0, 100, 1e-2
    limit = dp_accounting.get_epsilon_gaussian(sigma, d_gauss)  # ≈ 2.318
    gaps = []
    for p in (1e-3, 1e-4, 1e-5, 1e-6):
        delta = steps * p * d_gauss  # δ ≈ T·p·δ_Gauss(ε): sampling only rescales δ
        eps = revealed_sampled_epsilon(sigma, p, steps, delta)
        assert eps >= limit * (1 - 1e-9)
        gaps.append(eps - limit)
        amp = sampled_gaussian_epsilon(sigma, p, steps, delta, "pld", LEDGER_PLD_INTERVAL)
        assert amp < 0.02 * limit  # amplification would claim almost nothing was spent
    assert gaps == sorted(gaps, reverse=True)
    assert gaps[-1] < 1e-3 * limit


# ---------------------------------------------------------------- (d) composition
@pytest.mark.slow
def test_composes_with_library_events() -> None:
    rev = revealed(1.2, 0.02, 200)
    dlap = dp_event.DiscreteLaplaceDpEvent(0.5, 1)
    gauss = dp_event.GaussianDpEvent(3.0)
    delta = 1e-6
    for acc in ("pld", "rdp"):
        parts = [epsilon_of([e], delta, acc, LEDGER_PLD_INTERVAL) for e in (rev, dlap, gauss)]
        flat = epsilon_of([rev, dlap, gauss], delta, acc, LEDGER_PLD_INTERVAL)
        assert flat >= max(parts)
        # the same events nested inside Composed / SelfComposed give the same answer
        nested = dp_event.ComposedDpEvent(
            [
                dp_event.ComposedDpEvent([dlap, gauss]),
                dp_event.SelfComposedDpEvent(
                    dp_event.ComposedDpEvent([RevealedSampledGaussianDpEvent(1.2, 0.02)]), 200
                ),
            ]
        )
        assert epsilon_of([nested], delta, acc, LEDGER_PLD_INTERVAL) == pytest.approx(
            flat, rel=1e-6
        )
    # with another sampled (add/remove) event as well
    with_poisson = epsilon_of([rev, dlap, amplified(1.0, 0.01, 50)], delta, "pld")
    assert with_poisson >= epsilon_of([rev, dlap], delta, "pld")


@pytest.mark.slow
def test_existing_events_are_unchanged_by_the_extension() -> None:
    from dp_accounting.pld import pld_privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    events = [
        dp_event.GaussianDpEvent(1.0),
        dp_event.LaplaceDpEvent(2.0),
        dp_event.DiscreteLaplaceDpEvent(0.3, 2),
        amplified(0.9, 0.03, 40),
    ]
    lib = pld_privacy_accountant.PLDAccountant(value_discretization_interval=1e-3)
    lib.compose(dp_event.ComposedDpEvent(events))
    assert epsilon_of(events, 1e-5, "pld", 1e-3) == pytest.approx(lib.get_epsilon(1e-5), rel=1e-9)
    rdp_events = [events[0], events[3], dp_event.ZCDpEvent(0.1)]
    lib_rdp = rdp_privacy_accountant.RdpAccountant()
    lib_rdp.compose(dp_event.ComposedDpEvent(rdp_events))
    assert epsilon_of(rdp_events, 1e-5, "rdp") == pytest.approx(
        lib_rdp.get_epsilon(1e-5), rel=1e-12
    )


# ---------------------------------------------------------------- (e) JSON
def test_json_round_trip_and_validation() -> None:
    ev = RevealedSampledGaussianDpEvent(1.1, 128 / 1123)
    data = event_to_json(ev)
    assert data == {
        "type": "RevealedSampledGaussianDpEvent",
        "noise_multiplier": 1.1,
        "sampling_probability": 128 / 1123,
    }
    assert event_from_json(json.loads(canonical_json(data))) == ev
    nested = dp_event.ComposedDpEvent(
        [dp_event.SelfComposedDpEvent(ev, 64), dp_event.DiscreteLaplaceDpEvent(0.5, 1)]
    )
    assert event_from_json(json.loads(canonical_json(event_to_json(nested)))) == nested
    # the ledger groups identical steps into one self-composition, at the same cost
    grouped = canonical_events([ev] * 64)
    assert grouped == [dp_event.SelfComposedDpEvent(ev, 64)]
    for bad in (
        (0.0, 0.5),
        (-1.0, 0.5),
        (math.inf, 0.5),
        (math.nan, 0.5),
        (1.0, 0.0),
        (1.0, 1.5),
        (1.0, math.nan),
    ):
        with pytest.raises(ValueError):
            RevealedSampledGaussianDpEvent(*bad)
    with pytest.raises(ValueError):
        event_from_json({**data, "sampling_probability": 2.0})


# ---------------------------------------------------------------- (f) calibration
@pytest.mark.slow
@settings(max_examples=5, deadline=None)
@given(p=st.floats(0.001, 0.2), steps=st.integers(1, 100), eps=st.floats(0.5, 10))
def test_revealed_sigma_never_overshoots(p: float, steps: int, eps: float) -> None:
    delta = 1e-5
    sigma = revealed_sigma_for_epsilon(p, steps, eps, delta)
    assert revealed_sampled_epsilon(sigma, p, steps, delta) <= eps
    # and it is (nearly) the smallest such σ
    assert revealed_sampled_epsilon(sigma * (1 - 1e-3), p, steps, delta) > eps


@pytest.mark.slow
@settings(max_examples=6, deadline=None)
@given(sigma=st.floats(0.8, 4), p=st.floats(0.002, 0.1), eps=st.floats(1, 10))
def test_max_revealed_steps_never_overshoot(sigma: float, p: float, eps: float) -> None:
    delta = 1e-5
    steps = max_revealed_steps(sigma, p, eps, delta)
    if steps > 0:
        assert revealed_sampled_epsilon(sigma, p, steps, delta) <= eps
    assert revealed_sampled_epsilon(sigma, p, steps + 1, delta) > eps


@pytest.mark.slow
def test_calibration_rdp_and_refusals() -> None:
    sigma = revealed_sigma_for_epsilon(0.01, 100, 3.0, 1e-5, accountant="rdp")
    assert revealed_sampled_epsilon(sigma, 0.01, 100, 1e-5, accountant="rdp") <= 3.0
    assert sigma >= revealed_sigma_for_epsilon(0.01, 100, 3.0, 1e-5)  # RDP is looser
    assert revealed_sampled_epsilon(1.0, 0.1, 0, 1e-5) == 0.0
    with pytest.raises(ValueError):
        revealed_sampled_epsilon(1.0, 0.0, 10, 1e-5)
    with pytest.raises(ValueError):
        revealed_sigma_for_epsilon(0.1, 10, -1.0, 1e-5)
    with pytest.raises(ValueError):
        max_revealed_steps(1.0, 0.1, 1.0, 1.5)


# ------------------------------------------------ (g) a thousand steps (speed: dpda bench)
def test_one_thousand_steps_compose_to_the_exact_epsilon() -> None:
    event = revealed(1.0, 0.01, 1000)
    eps = epsilon_of([event], 1e-5, "pld", LEDGER_PLD_INTERVAL)
    assert eps == pytest.approx(exact_epsilon(1.0, 0.01, 1000, 1e-5), rel=1e-3)


@pytest.mark.slow
def test_planner_predicts_what_the_ledger_charges(capsys) -> None:
    """`dpda privacy epsilon` defaults to the charge dpda's attribute-unit minibatches get; the
    amplified add/remove bound is only shown on request (it under-states that charge)."""
    import json

    from dpda.cli.main import main
    from dpda.dp.accounting import revealed_sampled_epsilon

    argv = ["privacy", "epsilon", "--sigma", "1.1", "--sampling-rate", "0.114"]
    argv += ["--steps", "64", "--delta", "0.000742", "--json"]
    assert main(argv) == 0
    revealed = json.loads(capsys.readouterr().out)
    assert revealed["relation"] == "attribute"
    assert revealed["epsilon"] == revealed_sampled_epsilon(1.1, 0.114, 64, 0.000742)
    assert main([*argv, "--relation", "add-remove"]) == 0
    amplified = json.loads(capsys.readouterr().out)
    assert amplified["epsilon"] < revealed["epsilon"] / 3
