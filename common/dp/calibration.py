"""Calibration: the noise or the number of steps that meets an (ε, δ), rounded toward privacy.

Two searches invert a function of ``dpda.dp.accounting``: ``smallest_scale`` for every noise
scale (a spend that falls as the scale grows) and ``largest_count`` for every number of steps
(one that grows with the count). Each returns only a value whose spend it computed and found
≤ ε: the rule that no calibration overshoots ε lives in these two functions. A composition
too large for the thread's work bound (``work_bounds.PlanTooLarge``) is not a spend: the
searches for a noise scale move toward more noise, where compositions are smaller, and never
return an unchecked value; the searches for a number of steps raise ``StepsTooLarge`` (how
many steps were checked, and which count could not be computed) rather than call a count that
could not be computed one that spends too much.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

import dp_accounting
from dp_accounting import dp_event

from dpda.dp.accountants import LEDGER_PLD_INTERVAL, TABLE_PLD_INTERVAL, Accountant
from dpda.dp.accounting import (
    branched_epsilon,
    check_eps_delta,
    group_events,
    ledger_epsilon,
    revealed_sampled_epsilon,
    sampled_gaussian_epsilon,
)
from dpda.dp.work_bounds import (
    MAX_PLD_POINTS,
    PlanTooLarge,
    caches,
    check_deadline,
    size_bound,
)

# Relative safety margin used when rounding σ up after a closed-form root-finder: it makes the
# "never overshoots" property hold despite the root-finder's tolerance.
_SIGMA_ROUND_UP = 1e-9
# the scales a search tries: below the floor every spend is taken to be met (more noise is
# never needed), above the ceiling none is
_SIGMA_FLOOR = 1e-3
_SIGMA_CEILING = 1e6
# a noise multiplier for a number of steps: within 1e-4 of ε (the steps' σ sets every batch's
# noise, so it is searched closer than the exact calibration's default)
_SIGMA_TOL = 1e-4


class CalibrationMethod(StrEnum):
    THEOREM2 = "theorem2"
    ANALYTIC = "analytic"
    EXACT = "exact"  # the smallest σ the ledger's own accountant allows (``exact_noise_scale``)


class StepsTooLarge(PlanTooLarge):
    """A search for the most steps met a count whose composition is over the size bound:
    ``at_least`` steps were checked and keep ε; ``too_large`` steps could not be computed."""

    def __init__(self, at_least: int, too_large: int) -> None:
        super().__init__(
            f"at least {at_least} steps keep ε; the composition of {too_large} steps is too "
            "large to compute under the size bound"
        )
        self.at_least = at_least
        self.too_large = too_large


def _bounded_spend(spend: Callable[[], float]) -> float:
    """``spend()`` under the plans' size bound (``PlanTooLarge`` when over it)."""
    with size_bound(MAX_PLD_POINTS):
        return spend()


def _or_inf(spend: Callable[[], float]) -> float:
    """``spend()`` under the plans' size bound, or ∞ when its composition is over it."""
    try:
        with size_bound(MAX_PLD_POINTS):
            return spend()
    except PlanTooLarge:
        return math.inf


def sigma_theorem2(epsilon: float, delta: float) -> float:
    """Noise multiplier of Theorem 2 (LeTien et al., IJCAI 2019), formula as printed.

    σ/w = √(2 (ln(1/(2δ)) + ε)) / ε.  Closed form, so no rounding is needed; it is valid for
    every ε > 0 (unlike the classical bound, which needs ε < 1).
    """
    check_eps_delta(epsilon, delta)
    return math.sqrt(2.0 * (math.log(1.0 / (2.0 * delta)) + epsilon)) / epsilon


def sigma_analytic(epsilon: float, delta: float) -> float:
    """Smallest noise multiplier of the analytic Gaussian mechanism (Balle & Wang 2018).

    Uses ``dp_accounting.get_sigma_gaussian`` and rounds the root up until the exact ε of the
    result is ≤ the target, so the answer is always on the noisier side.
    """
    check_eps_delta(epsilon, delta)
    sigma = dp_accounting.get_sigma_gaussian(epsilon, delta)
    sigma *= 1.0 + _SIGMA_ROUND_UP
    while dp_accounting.get_epsilon_gaussian(sigma, delta) > epsilon:
        sigma *= 1.0 + 1e-6
    return float(sigma)


def calibrate_sigma(epsilon: float, delta: float, method: CalibrationMethod | str) -> float:
    """Noise multiplier of ONE Gaussian release at (ε, δ): Theorem 2, the analytic Gaussian, or
    exact (the smallest σ whose ``GaussianDpEvent`` the ledger charges ≤ ε)."""
    method = CalibrationMethod(method)
    if method is CalibrationMethod.THEOREM2:
        return sigma_theorem2(epsilon, delta)
    if method is CalibrationMethod.EXACT:
        check_eps_delta(epsilon, delta)
        return exact_noise_scale(
            lambda s: [dp_event.GaussianDpEvent(s)], epsilon, delta, key="gaussian"
        )
    return sigma_analytic(epsilon, delta)


def discrete_laplace_parameter(epsilon: float, sensitivity: int) -> float:
    """Parameter ``a`` of DLap(a) (pmf ∝ exp(-a|x|)): pure ε-DP at L1 sensitivity Δ when a = ε/Δ."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("epsilon must be a finite number > 0")
    if sensitivity < 1:
        raise ValueError("sensitivity must be a positive integer")
    return epsilon / sensitivity


def largest_count(ok: Callable[[int], bool], cap: int = 10_000_000) -> int:
    """Largest t ≥ 1 with ``ok(t)`` for a monotone ``ok`` (0 if none), capped at ``cap``:
    doubling, then bisection with the invariant "ok(lo), not ok(hi)". An ``ok`` whose
    composition is over the size bound (``PlanTooLarge``) is neither: ``StepsTooLarge``
    names the largest count checked and the one that could not be computed."""
    lo = 0

    def check(t: int) -> bool:
        try:
            return ok(t)
        except StepsTooLarge:
            raise
        except PlanTooLarge:
            raise StepsTooLarge(lo, t) from None

    if not check(1):
        return 0
    lo, hi = 1, 2
    while check(hi):
        lo, hi = hi, hi * 2
        if hi > cap:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if check(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_sampled_gaussian_steps(
    sigma: float,
    sampling_rate: float,
    epsilon: float,
    delta: float,
    accountant: Accountant | str,
    pld_interval: float = TABLE_PLD_INTERVAL,
) -> int:
    """Largest number of steps whose ε stays ≤ ``epsilon`` (rounds toward privacy: down);
    ``StepsTooLarge`` when a count the search needs is over the size bound."""
    check_eps_delta(epsilon, delta)

    def ok(t: int) -> bool:
        return (
            _bounded_spend(
                lambda: sampled_gaussian_epsilon(
                    sigma, sampling_rate, t, delta, accountant, pld_interval
                )
            )
            <= epsilon
        )

    return largest_count(ok)


def sampled_sigma_for_epsilon(
    sampling_rate: float,
    steps: int,
    epsilon: float,
    delta: float,
    accountant: Accountant | str,
    pld_interval: float = TABLE_PLD_INTERVAL,
) -> float:
    """Smallest noise multiplier (rounded up) so that ``steps`` sampled releases cost ≤ ε:
    ``smallest_scale``'s search, so the σ returned is one whose spend was computed."""
    check_eps_delta(epsilon, delta)
    return smallest_scale(
        lambda sigma: _or_inf(
            lambda: sampled_gaussian_epsilon(
                sigma, sampling_rate, steps, delta, accountant, pld_interval
            )
        ),
        epsilon,
        start=1.0,
        first_step=0.5,
        tol=_SIGMA_TOL,
    )


def revealed_sigma_for_epsilon(
    sampling_rate: float,
    steps: int,
    epsilon: float,
    delta: float,
    pld_interval: float = LEDGER_PLD_INTERVAL,
    accountant: Accountant | str = Accountant.PLD,
) -> float:
    """Smallest noise multiplier (rounded up) so that ``steps`` revealed steps cost ≤ ε:
    ``smallest_scale``'s search, so the σ returned is one whose spend was computed and it never
    overshoots ε. Raises ``ValueError`` when no σ ≤ 1e6 meets the target.
    """
    check_eps_delta(epsilon, delta)
    if steps < 1:
        raise ValueError("steps must be ≥ 1")
    return smallest_scale(
        lambda sigma: _or_inf(
            lambda: revealed_sampled_epsilon(
                sigma, sampling_rate, steps, delta, pld_interval, accountant
            )
        ),
        epsilon,
        start=1.0,
        first_step=0.5,
        tol=_SIGMA_TOL,
    )


def max_revealed_steps(
    sigma: float,
    sampling_rate: float,
    epsilon: float,
    delta: float,
    pld_interval: float = LEDGER_PLD_INTERVAL,
    accountant: Accountant | str = Accountant.PLD,
) -> int:
    """Largest number of revealed steps whose ε stays ≤ ``epsilon`` (rounded down; 0 if none).

    Doubling then bisection with the invariant "``lo`` meets the target"; capped at 10⁷ steps.
    ``StepsTooLarge`` when a count the search needs is over the size bound.
    """
    check_eps_delta(epsilon, delta)

    def ok(t: int) -> bool:
        e = _bounded_spend(
            lambda: revealed_sampled_epsilon(
                sigma, sampling_rate, t, delta, pld_interval, accountant
            )
        )
        return e <= epsilon

    return largest_count(ok)


# ------------------------------------------------------------ exact calibration (any events)
# The coarse grid of the first search: ~10× cheaper Gaussian PLDs; the second search and the
# returned scale use the ledger's own grid.
_COARSE_PLD_INTERVAL = 1e-2
_SCALE_SEARCH_STEPS = 60  # evaluations per search at most (each bracketing or narrowing step)


def smallest_scale(
    spend: Callable[[float], float], epsilon: float, start: float, first_step: float, tol: float
) -> float:
    """The smallest checked scale s with ``spend(s) ≤ epsilon`` for a ``spend`` that falls as s
    grows: bracketing from ``start`` by relative steps that double from ``first_step``, then a
    safeguarded secant in log s aimed just inside the target, stopped as soon as the feasible
    end spends ≥ (1 − tol)·ε or the bracket is 1e-6 wide. The scale returned is always one
    whose spend was computed and met ε; ``ValueError`` when none up to 1e6 does."""
    hi = start if math.isfinite(start) and start > 0 else 1.0
    f_hi = spend(hi)
    g = first_step
    if f_hi > epsilon:
        lo, f_lo = hi, f_hi
        while f_hi > epsilon:
            if hi >= _SIGMA_CEILING:
                raise ValueError("no noise level reaches that epsilon")
            lo, f_lo = hi, f_hi
            hi, g = min(lo * (1 + g), _SIGMA_CEILING), 2 * g
            f_hi = spend(hi)
    else:
        lo, f_lo = hi, f_hi
        while f_lo <= epsilon:
            if f_lo >= (1 - tol) * epsilon:
                return lo
            hi, f_hi = lo, f_lo
            lo, g = hi / (1 + g), 2 * g
            if lo < _SIGMA_FLOOR:
                return hi
            f_lo = spend(lo)
    last = ""
    for _ in range(_SCALE_SEARCH_STEPS):
        if f_hi >= (1 - tol) * epsilon or hi - lo <= 1e-6 * hi:
            break
        t = 0.5
        aim = epsilon * (1 - tol / 2)
        if math.isfinite(f_lo) and f_lo > f_hi and last != "twice":
            t = min(max((f_lo - aim) / (f_lo - f_hi), 0.02), 0.98)
        mid = math.exp(math.log(lo) + t * (math.log(hi) - math.log(lo)))
        f_mid = spend(mid)
        side = "hi" if f_mid <= epsilon else "lo"
        # the same end moved twice in a row: the secant stalls there, so bisect once
        last = "twice" if last == side else side
        if side == "hi":
            hi, f_hi = mid, f_mid
        else:
            lo, f_lo = mid, f_mid
    return hi


def exact_noise_scale(
    build: Callable[[float], Sequence[dp_event.DpEvent]],
    epsilon: float,
    delta: float,
    *,
    key: Any,
    tol: float = 1e-3,
) -> float:
    """The smallest noise scale s whose events ``build(s)`` the ledger charges at most ε at δ.

    ``build`` maps a scale to the release's events (every Gaussian multiplier grows with s;
    everything else is fixed); ``key`` names that map — two calls with the same key, ε and δ
    are the same search, cached (one float per entry). The charge is the ledger's own:
    ``ledger_epsilon(group_events(build(s)), δ)`` on the ledger's PLD grid, label branches
    included. A first search on a coarser grid, kept out of the shared caches (its PLDs are
    of no use to the ledger), finds the neighbourhood in ~10 cheap steps; a second, on the
    ledger's grid and through the ledger's own cached path, finds the scale in 1–5 steps, so
    the charge that follows finds its PLDs ready. Both run under the thread's ``time_limit``.
    Rounded toward more noise: the answer always spends ≤ ε, and ≥ (1 − ``tol``)·ε unless the
    search reached its floor.
    """
    check_eps_delta(epsilon, delta)

    # the coarse grid's rounding (up to one step per pure part) must stay well inside ε
    grid = max(LEDGER_PLD_INTERVAL, min(_COARSE_PLD_INTERVAL, epsilon / 100))

    def coarse(s: float) -> float:
        check_deadline()
        return _or_inf(lambda: branched_epsilon(group_events(build(s)), delta, grid, cached=False))

    def fine(s: float) -> float:
        return _or_inf(lambda: ledger_epsilon(group_events(build(s)), delta, LEDGER_PLD_INTERVAL))

    def make() -> float:
        start = sigma_analytic(epsilon, delta)  # a single Gaussian's: a starting point only
        try:
            near = smallest_scale(coarse, epsilon, start, 0.05, tol)
        except ValueError:  # the coarse grid's rounding alone may exceed a tiny ε
            near = start
        return smallest_scale(fine, epsilon, near, 0.01, tol)

    return float(caches().scale.get((key, epsilon, delta, tol), make))
