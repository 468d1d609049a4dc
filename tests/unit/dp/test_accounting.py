"""Accounting against DESIGN.md §8 (dp-accounting 0.6.0, add-or-remove-one)."""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting import dp_event
from hypothesis import given, settings
from hypothesis import strategies as st

from dpda.dp.accounting import epsilon_of, sampled_gaussian_epsilon
from dpda.dp.calibration import max_sampled_gaussian_steps, sigma_analytic, sigma_theorem2

DELTA = 1 / (1.2 * 4365)
P = 128 / 4365


def sig3(x: float) -> str:
    return f"{x:.3g}"


@pytest.mark.parametrize("eps,expected", [(4, 1.2181), (5, 1.0147), (10, 0.5978)])
def test_theorem2_sigma(eps: float, expected: float) -> None:
    assert sigma_theorem2(eps, DELTA) == pytest.approx(expected, abs=5e-5)


@pytest.mark.parametrize("eps,expected", [(4, 0.9221), (5, 0.7673), (10, 0.4420)])
def test_analytic_sigma(eps: float, expected: float) -> None:
    assert sigma_analytic(eps, DELTA) == pytest.approx(expected, abs=5e-5)


# (sigma, accountant, eps) → max steps; checked as ε(T) ≤ target < ε(T+1), which is exactly
# what "max steps = T" means and costs two accountant calls instead of a search.
STEPS = [
    (1.0, "rdp", 3, 302),
    (1.0, "rdp", 5, 838),
    (1.0, "rdp", 7, 1548),
    (1.0, "pld", 3, 407),
    (1.0, "pld", 5, 1044),
    (1.0, "pld", 7, 1870),
    (0.7, "rdp", 3, 17),
    (0.7, "rdp", 5, 120),
    (0.7, "rdp", 7, 287),
    (0.7, "pld", 3, 53),
    (0.7, "pld", 5, 200),
    (0.7, "pld", 7, 413),
]


@pytest.mark.slow
@pytest.mark.parametrize("sigma,acc,eps,steps", STEPS)
def test_sampled_gaussian_max_steps(sigma: float, acc: str, eps: float, steps: int) -> None:
    assert sampled_gaussian_epsilon(sigma, P, steps, DELTA, acc) <= eps
    assert sampled_gaussian_epsilon(sigma, P, steps + 1, DELTA, acc) > eps


@pytest.mark.slow
def test_max_steps_search_matches_table() -> None:
    assert max_sampled_gaussian_steps(0.7, P, 3, DELTA, "pld") == 53
    assert max_sampled_gaussian_steps(1.0, P, 3, DELTA, "rdp") == 302


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.05, 30), log_delta=st.floats(-12, -2))
def test_calibration_never_overshoots(eps: float, log_delta: float) -> None:
    delta = 10**log_delta
    for sigma in (sigma_analytic(eps, delta), sigma_theorem2(eps, delta)):
        assert dp_accounting.get_epsilon_gaussian(sigma, delta) <= eps


@pytest.mark.slow
@settings(max_examples=10, deadline=None)
@given(sigma=st.floats(0.6, 3), p=st.floats(0.005, 0.2), eps=st.floats(0.5, 8))
def test_steps_never_overshoot(sigma: float, p: float, eps: float) -> None:
    t = max_sampled_gaussian_steps(sigma, p, eps, 1e-5, "rdp")
    if t > 0:
        assert sampled_gaussian_epsilon(sigma, p, t, 1e-5, "rdp") <= eps


@pytest.mark.slow
def test_spend_is_derived_from_events_not_a_sum() -> None:
    g = dp_event.GaussianDpEvent(1.0)
    one = epsilon_of([g], 1e-5)
    two = epsilon_of([g, g], 1e-5)
    assert one < two < 2 * one  # composition is sub-additive, never a running sum


def test_discrete_laplace_pure_epsilon_and_rdp_reduction() -> None:
    # DLap(a) with sensitivity 1 is pure a-DP: the PLD accountant gives ε = a at tiny δ.
    ev = dp_event.DiscreteLaplaceDpEvent(0.5, 1)
    assert epsilon_of([ev], 1e-12, "pld") == pytest.approx(0.5, abs=1e-3)
    # RDP has no discrete Laplace: the reduction to ρ = ε²/2 zCDP must stay ≥ the pure ε
    # bound's (ε, δ) and ≤ the closed-form zCDP conversion ρ + 2√(ρ ln(1/δ)).
    rho = 0.5**2 / 2
    import math

    e_rdp = epsilon_of([ev], 1e-5, "rdp")
    assert e_rdp <= rho + 2 * math.sqrt(rho * math.log(1e5)) + 1e-9
    assert e_rdp >= epsilon_of([ev], 1e-5, "pld") - 1e-6


@pytest.mark.slow
def test_poisson_composed_gaussians_equal_single_gaussian() -> None:
    joint = dp_event.PoissonSampledDpEvent(
        0.05,
        dp_event.ComposedDpEvent([dp_event.GaussianDpEvent(1.0), dp_event.GaussianDpEvent(2.0)]),
    )
    eff = 1 / (1 + 0.25) ** 0.5
    single = dp_event.PoissonSampledDpEvent(0.05, dp_event.GaussianDpEvent(eff))
    for acc in ("pld", "rdp"):
        e1 = epsilon_of([dp_event.SelfComposedDpEvent(joint, 30)], 1e-5, acc)
        e2 = epsilon_of([dp_event.SelfComposedDpEvent(single, 30)], 1e-5, acc)
        assert e1 == pytest.approx(e2, rel=1e-9)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        sigma_theorem2(-1, 1e-5)
    with pytest.raises(ValueError):
        sigma_analytic(1, 2.0)
    with pytest.raises(ValueError):
        sampled_gaussian_epsilon(1.0, 1.5, 10, 1e-5, "pld")


def test_calibrated_minibatch_noise_needs_batches_and_steps() -> None:
    import pytest
    from pydantic import ValidationError

    from dpda.terms import SessionTerms

    with pytest.raises(ValidationError, match="noise_multiplier"):
        SessionTerms(dataset="d", epsilon=1, delta=1e-5, noise_multiplier=0.0)
    with pytest.raises(ValidationError, match="noise_multiplier"):
        SessionTerms(
            dataset="d",
            epsilon=1,
            delta=1e-5,
            noise_multiplier=0.0,
            batch_size=10,
            privacy_unit="attribute",
        )


def test_the_ledger_takes_the_bounded_range_of_exponential_mechanism_steps() -> None:
    """An exponential-mechanism step is ε₀-DP with bounded range (ε₀²/8-zCDP). The ledger's
    PLD accountant sees only generic ε₀-DP; its RDP accountant knows the bounded range. Both
    bound ε at δ for the same events, so the ledger takes the smaller (measured: 1,000 steps
    that RDP calibrates to ε = 1 are ε = 2.49 to PLD alone); ledgers without such steps keep the
    PLD figure exactly."""
    from dp_accounting import dp_event

    from dpda.dp import discrepancy as D
    from dpda.dp.ledger import spend_of

    delta = 1e-4
    eps0 = D.frank_wolfe_step_epsilon(1.0, delta, 1000)
    steps = D.frank_wolfe_event(eps0, 1000)
    pld_only = epsilon_of([steps], delta, "pld")
    rdp = epsilon_of([steps], delta, "rdp")
    assert rdp <= 1.0 + 1e-9 and pld_only > 2.0
    assert spend_of([steps], delta) == pytest.approx(rdp, rel=1e-9)
    # blocks of the same steps are the same composition
    assert spend_of([D.frank_wolfe_event(eps0, 400), D.frank_wolfe_event(eps0, 600)], delta) == (
        pytest.approx(rdp, rel=1e-6)
    )
    # a few steps: pure composition (PLD) is the tighter one, and it is kept
    few = D.frank_wolfe_event(0.5, 2)
    tight = min(epsilon_of([few], delta, "pld"), epsilon_of([few], delta, "rdp"))
    assert tight < epsilon_of([few], delta, "rdp")
    assert spend_of([few], delta) == pytest.approx(tight, rel=1e-3)
    # no exponential step: the PLD figure, unchanged
    g = dp_event.GaussianDpEvent(2.0)
    assert spend_of([g], delta) == pytest.approx(epsilon_of([g], delta, "pld", 1e-4), rel=1e-3)


def test_a_composition_in_flight_is_waited_for_not_made_twice() -> None:
    """The accountant's caches are single-flight: a thread asking for a value another thread
    is making waits for it (the target's pre-check waits for the composition started ahead of
    it instead of repeating it). A maker that fails leaves the key free: the next asker makes
    it again, and meets the same error."""
    import threading

    from dpda.dp.work_bounds import SingleFlightCache

    cache = SingleFlightCache(8)
    made: list[str] = []
    started, release = threading.Event(), threading.Event()

    def slow() -> float:
        made.append(threading.current_thread().name)
        started.set()
        assert release.wait(5)
        return 42.0

    got: list[float] = []
    first = threading.Thread(target=lambda: got.append(cache.get("k", slow)))
    first.start()
    assert started.wait(5)
    # asked while the first is making it: waits, and does not call its own maker
    second = threading.Thread(
        target=lambda: got.append(cache.get("k", lambda: pytest.fail("made twice")))
    )
    second.start()
    release.set()
    first.join()
    second.join()
    assert got == [42.0, 42.0] and len(made) == 1 and not SingleFlightCache._making

    def broken() -> float:
        raise RuntimeError("no")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            cache.get("bad", broken)
    assert "bad" not in cache and not SingleFlightCache._making
    assert cache.get("bad", lambda: 1.0) == 1.0


def test_a_waiter_keeps_its_own_time_limit_and_an_interrupted_maker_frees_the_key() -> None:
    """A plan waiting for a composition another thread is making still ends at its own time
    limit (``CalibrationTimeout``; the clock is the test's), while the maker finishes and caches
    its value; a maker interrupted by a ``BaseException`` (KeyboardInterrupt) leaves no key
    registered."""
    import itertools
    import threading

    from dpda.dp.work_bounds import CalibrationTimeout, SingleFlightCache, time_limit

    cache = SingleFlightCache(8)
    started, release = threading.Event(), threading.Event()

    def slow() -> float:
        started.set()
        assert release.wait(5)
        return 7.0

    first = threading.Thread(target=lambda: cache.get("k", slow))
    first.start()
    assert started.wait(5)
    ticks = itertools.count()  # the waiter's clock: 0 when the limit is set, then 1, 2, …
    with pytest.raises(CalibrationTimeout):
        with time_limit(0.5, clock=lambda: float(next(ticks))):
            cache.get("k", lambda: pytest.fail("made twice"))
    release.set()
    first.join()
    assert cache.get("k", lambda: pytest.fail("made twice")) == 7.0
    assert not SingleFlightCache._making

    def interrupted() -> float:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cache.get("i", interrupted)
    assert not SingleFlightCache._making and cache.get("i", lambda: 2.0) == 2.0


def test_a_plan_refuses_a_composition_over_its_size_bound_before_making_it() -> None:
    """Under ``size_bound`` a composition whose PLD would exceed the bound is refused before
    the library builds it (10⁴ full-batch steps at σ = 1 would need ~1.5·10⁷ points), and the
    calibrations treat it as spending more than ε: they still return a checked σ."""
    from dp_accounting import dp_event

    from dpda.dp.accounting import epsilon_of, sampled_gaussian_epsilon
    from dpda.dp.calibration import sampled_sigma_for_epsilon
    from dpda.dp.work_bounds import MAX_PLD_POINTS, PlanTooLarge, fresh_caches, size_bound

    full_batch = dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(1.0), 10_000)
    with fresh_caches(), size_bound(MAX_PLD_POINTS):
        with pytest.raises(PlanTooLarge):
            epsilon_of([full_batch], 1e-5, "pld", 1e-3)
        with pytest.raises(PlanTooLarge):
            sampled_gaussian_epsilon(1e-3, 0.5, 10, 1e-5, "pld", 1e-3)
        with size_bound(200_000):  # nested: the smaller bound holds
            sigma = sampled_sigma_for_epsilon(0.01, 100, 1.0, 1e-5, "pld", 1e-3)
    # a checked σ that meets ε; the bound only keeps the search to smaller compositions,
    # so it may stop at more noise than the unbounded search's
    assert sampled_gaussian_epsilon(sigma, 0.01, 100, 1e-5, "pld", 1e-3) <= 1.0
    assert sigma >= sampled_sigma_for_epsilon(0.01, 100, 1.0, 1e-5, "pld", 1e-3)


def test_the_accountants_are_those_of_the_pinned_dp_accounting() -> None:
    """The accountant subclasses use dp-accounting's ``_maybe_compose`` hook and ``_pld``
    state: the installed version is the one ``pyproject.toml`` pins, and the hooks exist."""
    import re
    from importlib.metadata import version
    from pathlib import Path

    from dp_accounting.pld import pld_privacy_accountant

    pinned = re.search(r'"dp-accounting==([^"]+)"', Path("pyproject.toml").read_text())
    assert pinned and version("dp-accounting") == pinned.group(1)
    acc = pld_privacy_accountant.PLDAccountant()
    assert callable(acc._maybe_compose) and hasattr(acc, "_pld")
    assert hasattr(acc, "_contains_non_dp_event")


def test_revealed_sampled_epsilon_is_remembered_exactly() -> None:
    """Every plan of the same terms asks for the same ε (target ahead, source, target's check
    of the source's plan): the second ask is the first's value, bit for bit, and both are the
    composition ``epsilon_of`` makes from scratch."""
    from dpda.dp import accounting
    from dpda.dp.events import RevealedSampledGaussianDpEvent
    from dpda.dp.work_bounds import fresh_caches

    args = (1.3, 0.03, 5, 1e-5)
    with fresh_caches() as own:
        first = accounting.revealed_sampled_epsilon(*args)
        key = (*args, accounting.LEDGER_PLD_INTERVAL, "pld")
        assert own.sampled.get(key, lambda: pytest.fail("not remembered")) == first
        assert accounting.revealed_sampled_epsilon(*args) == first
    fresh = epsilon_of(
        [dp_event.SelfComposedDpEvent(RevealedSampledGaussianDpEvent(1.3, 0.03), 5)],
        1e-5,
        "pld",
        accounting.LEDGER_PLD_INTERVAL,
    )
    assert fresh == first
    # the accountant is part of the key: RDP is not served PLD's figure
    assert accounting.revealed_sampled_epsilon(*args, accountant="rdp") != first


@pytest.mark.parametrize(
    ("sigma", "rate", "count", "relation"),
    [
        (0.7, 0.0293242, 1, "add"),
        (0.7, 0.0293242, 37, "add"),
        (1.3, 0.5, 5, "add"),
        (2.0, 0.01, 300, "replace"),
    ],
)
def test_the_remembered_sampled_gaussian_step_composes_as_the_librarys_own(
    sigma, rate, count, relation
) -> None:
    """A Poisson-sampled Gaussian step's PLD is built once and self-composed for each count
    (``accountants.sampled_gaussian_pld``): the ε it gives is the library's own accountant's,
    to the last bit, and a second count reuses the step."""
    from dp_accounting.pld.pld_privacy_accountant import PLDAccountant

    from dpda.dp.accountants import PldAccountant, sampled_gaussian_pld

    rel = dp_accounting.NeighboringRelation
    neighbours = rel.ADD_OR_REMOVE_ONE if relation == "add" else rel.REPLACE_ONE
    step = dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(sigma))
    event = dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(step, count)])
    ours = PldAccountant(neighboring_relation=neighbours, value_discretization_interval=1e-3)
    theirs = PLDAccountant(neighboring_relation=neighbours, value_discretization_interval=1e-3)
    sampled_gaussian_pld.cache_clear()
    ours.compose(event)
    theirs.compose(event)
    assert ours.get_epsilon(1e-5) == theirs.get_epsilon(1e-5)
    again = PldAccountant(neighboring_relation=neighbours, value_discretization_interval=1e-3)
    again.compose(dp_event.SelfComposedDpEvent(step, count + 1))
    assert sampled_gaussian_pld.cache_info().hits == 1
