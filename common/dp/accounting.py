"""Pure privacy math: calibration and accounting, no state.

Every function here is a function of public parameters (ε, δ, σ, p, steps). Spend is always
derived from a list of ``dp_accounting.DpEvent`` objects by a PLD (default) or RDP accountant,
never from a running sum of ε.

Conventions
-----------
* ``sigma`` is a *noise multiplier*: the standard deviation of the Gaussian noise per unit of L2
  sensitivity. The caller multiplies it by the mechanism's sensitivity.
* Calibration always rounds toward more noise: a returned σ never gives more than the target ε,
  a returned step count never exceeds the target ε (both are property-tested).
* Neighbouring relation: add-or-remove-one (the default of the paper and of dp-accounting). Under
  replace-one every sensitivity doubles; the mechanisms fold that factor into the noise
  multipliers they record, so the events below are always accounted under add-or-remove.
* Attribute relation (one feature of one record changes, the record is in both datasets):
  Poisson sampling is *revealed* and amplifies δ, not ε. Such steps are recorded as
  ``events.RevealedSampledGaussianDpEvent`` and accounted exactly (PLD: the mixture
  ``(1 − p)·identity + p·Gaussian``; RDP: its closed-form Rényi divergence), never as the
  add/remove-amplified ``PoissonSampledDpEvent``, which would under-charge.
* Label branches (``events.LabelBranchDpEvent``, record-unit aggregates under replace-one): the
  ε of a list of events is the maximum over the two branches of the ε of the composition with
  every branched event replaced by that branch (``epsilon_of``, ``ledger_epsilon``).
"""

from __future__ import annotations

import functools
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from enum import StrEnum
from typing import Any

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from dpda.dp.events import (
    BRANCHES,
    ExponentialMechanismDpEvent,
    RevealedSampledGaussianDpEvent,
    branch_of,
    canonical_json,
    event_to_json,
    has_branches,
)

# Relative safety margin used when rounding σ up after a root-finder: it makes the
# "never overshoots" property hold despite the root-finder's tolerance.
_SIGMA_ROUND_UP = 1e-9


class Accountant(StrEnum):
    PLD = "pld"
    RDP = "rdp"


class CalibrationMethod(StrEnum):
    THEOREM2 = "theorem2"
    ANALYTIC = "analytic"
    EXACT = "exact"  # the smallest σ the ledger's own accountant allows (``exact_noise_scale``)


def _check_eps_delta(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("epsilon must be a finite number > 0")
    if not (0 < delta < 1):
        raise ValueError("delta must lie strictly between 0 and 1")


def sigma_theorem2(epsilon: float, delta: float) -> float:
    """Noise multiplier of Theorem 2 (LeTien et al., IJCAI 2019), formula as printed.

    σ/w = √(2 (ln(1/(2δ)) + ε)) / ε.  Closed form, so no rounding is needed; it is valid for
    every ε > 0 (unlike the classical bound, which needs ε < 1).
    """
    _check_eps_delta(epsilon, delta)
    return math.sqrt(2.0 * (math.log(1.0 / (2.0 * delta)) + epsilon)) / epsilon


def sigma_analytic(epsilon: float, delta: float) -> float:
    """Smallest noise multiplier of the analytic Gaussian mechanism (Balle & Wang 2018).

    Uses ``dp_accounting.get_sigma_gaussian`` and rounds the root up until the exact ε of the
    result is ≤ the target, so the answer is always on the noisier side.
    """
    _check_eps_delta(epsilon, delta)
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
        _check_eps_delta(epsilon, delta)
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


def _flatten(event: dp_event.DpEvent) -> list[tuple[dp_event.DpEvent, int]]:
    if isinstance(event, dp_event.ComposedDpEvent):
        out: list[tuple[dp_event.DpEvent, int]] = []
        for e in event.events:
            out.extend(_flatten(e))
        return out
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return [(e, c * event.count) for e, c in _flatten(event.event)]
    return [(event, 1)]


def _gaussian_equivalent(event: dp_event.DpEvent) -> float | None:
    """Noise multiplier of a single Gaussian equal to a composition of Gaussians, else None.

    Releasing independent Gaussians with multipliers σ_i about the same record is exactly one
    Gaussian mechanism with multiplier (Σ σ_i⁻²)^(-1/2) (the sensitivity vector is stacked).
    """
    parts = _flatten(event)
    if not all(isinstance(e, dp_event.GaussianDpEvent) for e, _ in parts):
        return None
    if any(e.noise_multiplier == 0 for e, _ in parts):
        return 0.0  # a noiseless release: not private at all
    inv = sum(c / (e.noise_multiplier**2) for e, c in parts)
    return math.inf if inv == 0 else 1.0 / math.sqrt(inv)


def _for_accountant(event: dp_event.DpEvent, accountant: Accountant) -> dp_event.DpEvent:
    """Rewrite an event into one the chosen accountant supports, exactly or conservatively.

    * PLD: a Poisson-sampled composition of Gaussians becomes one sampled Gaussian (exact).
    * RDP: a discrete Laplace with pure ε is replaced by ρ = ε²/2 zCDP (Bun & Steinke 2016,
      Prop. 1.4), a valid upper bound; dp-accounting's RDP accountant has no discrete Laplace.
    * Both: a revealed sampled Gaussian with p = 1 is the plain Gaussian (exact), so that it
      merges with the other Gaussians below.
    """
    if isinstance(event, RevealedSampledGaussianDpEvent) and event.sampling_probability == 1:
        return dp_event.GaussianDpEvent(event.noise_multiplier)
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([_for_accountant(e, accountant) for e in event.events])
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(_for_accountant(event.event, accountant), event.count)
    if isinstance(event, dp_event.PoissonSampledDpEvent) and accountant is Accountant.PLD:
        sigma = _gaussian_equivalent(event.event)
        if sigma is not None:
            return dp_event.PoissonSampledDpEvent(
                event.sampling_probability, dp_event.GaussianDpEvent(sigma)
            )
    if isinstance(event, dp_event.DiscreteLaplaceDpEvent) and accountant is Accountant.RDP:
        eps = event.noise_parameter * event.sensitivity
        return dp_event.ZCDpEvent(rho=eps * eps / 2.0)
    return event


# PLD discretization: dp-accounting's default 1e-4 reproduces DESIGN.md §8 to 3 significant
# digits; the ledger uses 1e-3, ten times faster. Both are pessimistic discretizations (upper
# bounds on ε), so the coarser one is still a valid, at most ~1e-4 looser, bound.
TABLE_PLD_INTERVAL = 1e-4
LEDGER_PLD_INTERVAL = 1e-3


@functools.lru_cache(maxsize=32)  # PLDs are immutable: the planner and the ledger share them
def revealed_sampled_gaussian_pld(
    sigma: float, sampling_rate: float, pld_interval: float = LEDGER_PLD_INTERVAL
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """PLD of ONE revealed sampled Gaussian step: ``(1 − p)·identity + p·Gaussian(σ)``.

    The coin "record in the batch" is the same in both neighbours and is part of the output, so
    the output pair is a mixture with revealed component and its privacy loss distribution is
    the same mixture of the components' PLDs: the loss is 0 with probability 1 − p (identity:
    both neighbours give the same output) and follows the Gaussian PLD N(μ²/2, μ²), μ = 1/σ,
    with probability p. Both components live on the same pessimistic grid of step
    ``pld_interval`` (connect-the-dots for the Gaussian, exact for the identity), and the
    mixture is formed pointwise for the remove and the add PMF alike (infinity masses mix
    linearly: ``PrivacyLossDistribution.compute_mixture``).

    Pessimism is preserved: for a revealed mixture every hockey-stick divergence is the
    p-weighted mean of the components', ``H_ε = (1 − p)·0 + p·H_ε(Gauss)``, and the pessimistic
    Gaussian PLD dominates the true one at every ε, so the mixture dominates the true step;
    composition of dominating PLDs dominates the composition (Zhu, Dong & Wang 2022).
    """
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError("sigma must be a finite number > 0")
    if not (0 < sampling_rate <= 1):
        raise ValueError("sampling rate must lie in (0, 1]")
    gaussian = privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma,
        sensitivity=1.0,
        pessimistic_estimate=True,
        value_discretization_interval=pld_interval,
    )
    if sampling_rate == 1:
        return gaussian
    identity = privacy_loss_distribution.identity(
        value_discretization_interval=pld_interval, pessimistic_estimate=True
    )
    return gaussian.compute_mixture(identity, sampling_rate)


def revealed_sampled_gaussian_rdp(
    sigma: float, sampling_rate: float, orders: Sequence[float] | np.ndarray
) -> np.ndarray:
    """Rényi DP of ONE revealed sampled Gaussian step, at each order α > 1 (exact).

    With the coin revealed, E_Q[(P/Q)^α] = (1 − p)·1 + p·exp(α(α − 1)/(2σ²)), hence

        ε_α = log(1 − p + p·exp(α(α − 1)/(2σ²))) / (α − 1).

    Computed as log1p(p·expm1(x)) for moderate x = α(α − 1)/(2σ²) (accurate when x is tiny)
    and as x + log p + log1p((1 − p)/(p·e^x)) for large x (no overflow).
    """
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError("sigma must be a finite number > 0")
    if not (0 < sampling_rate <= 1):
        raise ValueError("sampling rate must lie in (0, 1]")
    alpha = np.asarray(orders, dtype=np.float64)
    if np.any(alpha <= 1):
        raise ValueError("RDP orders must be > 1")
    x = alpha * (alpha - 1) / (2.0 * sigma * sigma)
    p = sampling_rate
    small = x < 30.0
    log_moment = np.empty_like(x)
    log_moment[small] = np.log1p(p * np.expm1(x[small]))
    big = x[~small]
    log_moment[~small] = big + math.log(p) + np.log1p((1.0 - p) / p * np.exp(-big))
    return log_moment / (alpha - 1)


class _PLDAccountant(pld_privacy_accountant.PLDAccountant):
    """dp-accounting's PLD accountant, plus ``RevealedSampledGaussianDpEvent``.

    Every other event (and the Composed / SelfComposed traversal, which dispatches back here)
    is handled by the library unchanged. Relies on the accountant's ``_maybe_compose`` hook
    and ``_pld`` state (dp-accounting 0.6.0; the tests pin the results of library events).
    """

    _pld: privacy_loss_distribution.PrivacyLossDistribution

    def _maybe_compose(
        self, event: dp_event.DpEvent, count: int, do_compose: bool
    ) -> dp_accounting.PrivacyAccountant.CompositionErrorDetails | None:
        if isinstance(event, RevealedSampledGaussianDpEvent):
            if do_compose and count > 0:
                step = revealed_sampled_gaussian_pld(
                    event.noise_multiplier,
                    event.sampling_probability,
                    self._value_discretization_interval,
                )
                self._pld = self._pld.compose(step.self_compose(count))
            return None
        if isinstance(event, ExponentialMechanismDpEvent):
            if do_compose and count > 0:
                step = privacy_loss_distribution.from_privacy_parameters(
                    dp_accounting.pld.common.DifferentialPrivacyParameters(event.epsilon, 0.0),
                    value_discretization_interval=self._value_discretization_interval,
                )
                self._pld = self._pld.compose(step.self_compose(count))
            return None
        return super()._maybe_compose(event, count, do_compose)


class _RdpAccountant(rdp_privacy_accountant.RdpAccountant):
    """dp-accounting's RDP accountant, plus ``RevealedSampledGaussianDpEvent`` (closed form).

    Relies on the accountant's ``_maybe_compose`` hook and ``_rdp`` / ``_orders`` state.
    """

    _rdp: np.ndarray
    _orders: np.ndarray

    def _maybe_compose(
        self, event: dp_event.DpEvent, count: int, do_compose: bool
    ) -> dp_accounting.PrivacyAccountant.CompositionErrorDetails | None:
        if isinstance(event, RevealedSampledGaussianDpEvent):
            if do_compose:
                self._rdp += count * revealed_sampled_gaussian_rdp(
                    event.noise_multiplier, event.sampling_probability, self._orders
                )
            return None
        if isinstance(event, ExponentialMechanismDpEvent):
            if do_compose:
                eps = event.epsilon
                self._rdp += count * np.minimum(eps, self._orders * eps * eps / 8.0)
            return None
        return super()._maybe_compose(event, count, do_compose)


def make_accountant(
    accountant: Accountant | str, pld_interval: float = TABLE_PLD_INTERVAL
) -> dp_accounting.PrivacyAccountant:
    """A fresh accountant: the library's, extended with ``RevealedSampledGaussianDpEvent``."""
    accountant = Accountant(accountant)
    if accountant is Accountant.PLD:
        return _PLDAccountant(value_discretization_interval=pld_interval)
    return _RdpAccountant()


class CalibrationTimeout(Exception):
    """A calibration ran past the time limit set with ``time_limit``."""


_deadline = threading.local()


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Bound the accounting work done in this thread: every ``epsilon_of`` evaluation past the
    deadline raises ``CalibrationTimeout`` (calibrations are loops of such evaluations). The
    source plans a peer's session under this limit, outside any lock."""
    previous = getattr(_deadline, "at", None)
    _deadline.at = None if seconds is None else time.monotonic() + seconds
    try:
        yield
    finally:
        _deadline.at = previous


def _tick() -> None:
    at = getattr(_deadline, "at", None)
    if at is not None and time.monotonic() > at:
        raise CalibrationTimeout("accounting time limit reached")


def epsilon_of(
    events: Sequence[dp_event.DpEvent],
    delta: float,
    accountant: Accountant | str = "pld",
    pld_interval: float = TABLE_PLD_INTERVAL,
) -> float:
    """ε at ``delta`` of the composition of ``events`` (add-or-remove-one accounting); with label
    branches, the larger of the two branches' compositions."""
    if not (0 < delta < 1):
        raise ValueError("delta must lie strictly between 0 and 1")
    _tick()
    acc_kind = Accountant(accountant)
    if not events:
        return 0.0
    if any(has_branches(e) for e in events):
        # the branch is the neighbouring pair's, the same in every event (LabelBranchDpEvent)
        return max(
            epsilon_of([branch_of(e, b) for e in events], delta, acc_kind, pld_interval)
            for b in BRANCHES
        )
    acc = make_accountant(acc_kind, pld_interval)
    rewritten = [_for_accountant(e, acc_kind) for e in events]
    if acc_kind is Accountant.PLD:
        # Exact: all un-sampled Gaussian parts about the same record are one Gaussian mechanism.
        gauss = [e for e in rewritten if _gaussian_equivalent(e) is not None]
        if len(gauss) > 1 or any(isinstance(e, dp_event.SelfComposedDpEvent) for e in gauss):
            merged = _gaussian_equivalent(dp_event.ComposedDpEvent(gauss))
            rest = [e for e in rewritten if _gaussian_equivalent(e) is None]
            rewritten = [*rest, dp_event.GaussianDpEvent(merged)]
    composed = dp_event.ComposedDpEvent(rewritten)
    if not acc.supports(composed):
        raise ValueError(f"the {acc_kind.value} accountant does not support this event")
    acc.compose(composed)
    return float(acc.get_epsilon(delta))


def _check_sampled(sigma: float, sampling_rate: float, steps: int) -> None:
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError("sigma must be a finite number > 0")
    if not (0 < sampling_rate <= 1):
        raise ValueError("sampling rate must lie in (0, 1]")
    if steps < 0:
        raise ValueError("steps must be ≥ 0")


def sampled_gaussian_epsilon(
    sigma: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    accountant: Accountant | str,
    pld_interval: float = TABLE_PLD_INTERVAL,
) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian releases (rate p, multiplier σ)."""
    _check_sampled(sigma, sampling_rate, steps)
    if steps == 0:
        return 0.0
    event = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sampling_rate, dp_event.GaussianDpEvent(sigma)), steps
    )
    return epsilon_of([event], delta, accountant, pld_interval)


def _largest_ok(ok: Callable[[int], bool], cap: int = 10_000_000) -> int:
    """Largest t ≥ 1 with ``ok(t)`` for a monotone ``ok`` (0 if none), capped at ``cap``:
    doubling, then bisection with the invariant "ok(lo), not ok(hi)"."""
    if not ok(1):
        return 0
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > cap:
            return lo
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ok(mid):
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
    """Largest number of steps whose ε stays ≤ ``epsilon`` (rounds toward privacy: down)."""
    _check_eps_delta(epsilon, delta)

    def ok(t: int) -> bool:
        e = sampled_gaussian_epsilon(sigma, sampling_rate, t, delta, accountant, pld_interval)
        return e <= epsilon

    return _largest_ok(ok)


def sampled_sigma_for_epsilon(
    sampling_rate: float,
    steps: int,
    epsilon: float,
    delta: float,
    accountant: Accountant | str,
    pld_interval: float = TABLE_PLD_INTERVAL,
) -> float:
    """Smallest noise multiplier (rounded up) so that ``steps`` sampled releases cost ≤ ε."""
    _check_eps_delta(epsilon, delta)

    def eps(sigma: float) -> float:
        return sampled_gaussian_epsilon(
            sigma, sampling_rate, steps, delta, accountant, pld_interval
        )

    lo, hi = 1e-2, 1.0
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ValueError("no noise level reaches that epsilon")
    for _ in range(40):  # invariant: hi satisfies the target
        mid = 0.5 * (lo + hi)
        if eps(mid) <= epsilon:
            hi = mid
        else:
            lo = mid
        if hi - lo < 1e-4 * hi:
            break
    return hi


# ---------------------------------------------------------------- attribute relation (revealed)
def revealed_sampled_epsilon(
    sigma: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    pld_interval: float = LEDGER_PLD_INTERVAL,
    accountant: Accountant | str = Accountant.PLD,
) -> float:
    """ε of ``steps`` revealed Poisson-sampled Gaussian steps (attribute relation).

    Upper bound on the ε solving δ = Σ_K Bin(K; T, p)·δ_Gauss(ε; √K/σ) (see
    ``events.RevealedSampledGaussianDpEvent``): pessimistic PLD by default, RDP on request.
    """
    _check_sampled(sigma, sampling_rate, steps)
    if steps == 0:
        return 0.0
    event = dp_event.SelfComposedDpEvent(
        RevealedSampledGaussianDpEvent(sigma, sampling_rate), steps
    )
    # a pure function of public numbers, asked for again by every plan of the same terms: by
    # the target ahead of its session, by the source, by the target checking the source's plan
    key = (sigma, sampling_rate, steps, delta, pld_interval, Accountant(accountant).value)
    return float(
        _cached(
            _SAMPLED_CACHE,
            key,
            lambda: epsilon_of([event], delta, accountant, pld_interval),
            size=1024,  # a calibration asks for ~20 σ; one float per entry
        )
    )


# Search range of the revealed-σ calibration. Below the floor no σ is returned: at σ → 0 every
# sampled step is non-private, and a target that a σ this small meets is met only because δ
# already exceeds the probability that the record is ever sampled.
_SIGMA_FLOOR = 1e-3
_SIGMA_CEILING = 1e6


def revealed_sigma_for_epsilon(
    sampling_rate: float,
    steps: int,
    epsilon: float,
    delta: float,
    pld_interval: float = LEDGER_PLD_INTERVAL,
    accountant: Accountant | str = Accountant.PLD,
) -> float:
    """Smallest noise multiplier (rounded up) so that ``steps`` revealed steps cost ≤ ε.

    Bisection on σ with the invariant "``hi`` meets the target", stopped at a relative width
    of 1e-4; the σ returned is always one that was checked, so it never overshoots ε.
    Raises ``ValueError`` when no σ ≤ 1e6 meets the target.
    """
    _check_eps_delta(epsilon, delta)
    if steps < 1:
        raise ValueError("steps must be ≥ 1")

    def ok(sigma: float) -> bool:
        e = revealed_sampled_epsilon(sigma, sampling_rate, steps, delta, pld_interval, accountant)
        return e <= epsilon

    hi = 1.0
    while not ok(hi):
        hi *= 2
        if hi > _SIGMA_CEILING:
            raise ValueError("no noise level reaches that epsilon")
    lo = hi / 2
    while ok(lo):  # find a σ that fails (invariant: ok(hi), not ok(lo))
        hi, lo = lo, lo / 2
        if lo < _SIGMA_FLOOR:
            return hi
    while hi - lo > 1e-4 * hi:
        mid = 0.5 * (lo + hi)
        if ok(mid):
            hi = mid
        else:
            lo = mid
    return hi


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
    """
    _check_eps_delta(epsilon, delta)

    def ok(t: int) -> bool:
        e = revealed_sampled_epsilon(sigma, sampling_rate, t, delta, pld_interval, accountant)
        return e <= epsilon

    return _largest_ok(ok)


# ------------------------------------------------------------ exact calibration (any events)
# The coarse grid of the first search: ~10× cheaper Gaussian PLDs; the second search and the
# returned scale use the ledger's own grid.
_COARSE_PLD_INTERVAL = 1e-2
_SCALE_SEARCH_STEPS = 60  # evaluations per search at most (each bracketing or narrowing step)


def _smallest_ok(
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
            lo, f_lo = hi, f_hi
            hi, g = lo * (1 + g), 2 * g
            if hi > _SIGMA_CEILING:
                raise ValueError("no noise level reaches that epsilon")
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
    _check_eps_delta(epsilon, delta)

    # the coarse grid's rounding (up to one step per pure part) must stay well inside ε
    grid = max(LEDGER_PLD_INTERVAL, min(_COARSE_PLD_INTERVAL, epsilon / 100))

    def coarse(s: float) -> float:
        _tick()
        return _branched(group_events(build(s)), delta, grid, cached=False)

    def fine(s: float) -> float:
        return ledger_epsilon(group_events(build(s)), delta, LEDGER_PLD_INTERVAL)

    def make() -> float:
        start = sigma_analytic(epsilon, delta)  # a single Gaussian's: a starting point only
        try:
            near = _smallest_ok(coarse, epsilon, start, 0.05, tol)
        except ValueError:  # the coarse grid's rounding alone may exceed a tiny ε
            near = start
        return _smallest_ok(fine, epsilon, near, 0.01, tol)

    return float(_cached(_SCALE_CACHE, (key, epsilon, delta, tol), make, size=1024))


# ----------------------------------------------------------------- the ledger's running spend
# Keyed caches for the ledger: a charge recomposes only what changed. PLDs are immutable, so
# sharing them between calls (and threads) is safe.
_STEP_CACHE: OrderedDict[tuple[str, int, float], Any] = OrderedDict()
_FOLD_CACHE: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_CACHE_LOCK = threading.Lock()
_CACHE_SIZE = 64  # PLDs of ~0.1–1 MB each
_EPSILON_CACHE: OrderedDict[tuple[Any, ...], float] = OrderedDict()  # one float per entry
_SAMPLED_CACHE: OrderedDict[tuple[Any, ...], float] = OrderedDict()  # revealed_sampled_epsilon
_SCALE_CACHE: OrderedDict[tuple[Any, ...], float] = OrderedDict()  # exact_noise_scale
_NOT_DP = object()  # a group with no DP guarantee: ε = ∞
_MAKING: dict[tuple[int, Any], threading.Event] = {}  # (cache, key) being made now
_WAIT_TICK_S = 0.05  # how often a thread waiting for another's composition checks its deadline


def _cached(
    cache: OrderedDict[Any, Any], key: Any, make: Callable[[], Any], size: int = _CACHE_SIZE
) -> Any:
    """``cache[key]``, made by ``make`` on a miss, once: a thread that finds the same key being
    made waits for it rather than making it again (a charge's pre-check waits for the
    composition started ahead of it instead of repeating 30–100 ms of PLD). Keys nest one way
    only (ε → fold of a prefix → step; a fold's prefix is shorter), so no wait is circular. If
    the maker fails, a waiter makes the value itself (and meets the same error)."""
    slot = (id(cache), key)
    while True:
        mine: threading.Event | None = None
        try:
            with _CACHE_LOCK:
                if key in cache:
                    cache.move_to_end(key)
                    return cache[key]
                busy = _MAKING.get(slot)
                if busy is None:
                    mine = threading.Event()
                    _MAKING[slot] = mine
            if busy is not None:
                while not busy.wait(_WAIT_TICK_S):
                    _tick()  # a waiter keeps its own time limit (a plan's), not the maker's
                continue
            value = make()
            with _CACHE_LOCK:
                cache[key] = value
                while len(cache) > size:
                    cache.popitem(last=False)
            return value
        finally:
            # registered and cleared inside one ``try``: an exception anywhere after the key is
            # registered (KeyboardInterrupt included) frees it for the threads waiting on it
            if mine is not None:
                with _CACHE_LOCK:
                    if _MAKING.get(slot) is mine:
                        del _MAKING[slot]
                mine.set()


def _pld_of(
    key: str, event: dp_event.DpEvent, count: int, interval: float, cached: bool = True
) -> Any:
    """PLD of ``event`` composed ``count`` times (the accountant's own construction); with
    ``cached`` false the same construction, kept out of the shared caches."""

    def make() -> Any:
        acc = _PLDAccountant(value_discretization_interval=interval)
        ev = event if count == 1 else dp_event.SelfComposedDpEvent(event, count)
        if not acc.supports(ev):
            raise ValueError("the pld accountant does not support this event")
        acc.compose(ev)
        if acc._contains_non_dp_event:
            return _NOT_DP
        return acc._pld

    return _cached(_STEP_CACHE, (key, count, interval), make) if cached else make()


def _fold(
    prefix: tuple[tuple[str, int], ...],
    events: dict[str, dp_event.DpEvent],
    interval: float,
    cached: bool = True,
) -> Any:
    """Left fold of the groups' PLDs; every prefix is cached, so appending a group or counting
    one more of the last group recomposes one step (``cached`` false: the same fold, uncached)."""
    if not prefix:
        return None
    key, count = prefix[-1]

    def make() -> Any:
        head = _fold(prefix[:-1], events, interval, cached)
        step = _pld_of(key, events[key], count, interval, cached)
        if step is _NOT_DP or head is _NOT_DP:
            return _NOT_DP
        return step if head is None else head.compose(step)

    return _cached(_FOLD_CACHE, (prefix, interval), make) if cached else make()


def ledger_epsilon(
    groups: Sequence[tuple[str, dp_event.DpEvent, int]],
    delta: float,
    pld_interval: float = LEDGER_PLD_INTERVAL,
) -> float:
    """ε at ``delta`` of a ledger's events, given as ``(key, event, count)`` groups of identical
    events in order of first appearance (``ledger.group_events``).

    Exactly as ``epsilon_of``: each group is the event self-composed ``count`` times, and all
    groups that are (compositions of) plain Gaussians merge into one Gaussian (exact); the
    other groups compose in order. Because the order is that of first appearance, the PLD of
    every prefix of groups is reused from the cache: a charge that repeats the newest event
    (every batch of a session) or adds a new one costs one self-composition and one
    composition, however long the ledger (on 9ac3bc1 every charge recomposed every distinct
    event from scratch, three times).
    """
    if not (0 < delta < 1):
        raise ValueError("delta must lie strictly between 0 and 1")
    _tick()
    if not groups:
        return 0.0
    # the groups' keys are their events' canonical JSON: equal keys, equal ε (reading ε off a
    # cached PLD still costs 2–3 ms, and a charge reads it for each cap, on both sides)
    key = (tuple((k, n) for k, _, n in groups), delta, pld_interval)
    return float(_cached(_EPSILON_CACHE, key, lambda: _branched(groups, delta, pld_interval)))


def group_events(events: Sequence[dp_event.DpEvent]) -> list[tuple[str, dp_event.DpEvent, int]]:
    """Identical events grouped as ``(key, event, count)`` in order of first appearance: the
    form ``ledger_epsilon`` composes (and caches by prefix). The key is the event's canonical
    JSON."""
    counts: dict[str, list[Any]] = {}
    for e in events:
        key = canonical_json(event_to_json(e))
        if key in counts:
            counts[key][1] += 1
        else:
            counts[key] = [e, 1]
    return [(k, e, n) for k, (e, n) in counts.items()]


def branch_groups(
    groups: Sequence[tuple[str, dp_event.DpEvent, int]], branch: str
) -> list[tuple[str, dp_event.DpEvent, int]]:
    """The groups of one label branch: a group without branches stays as it is; a branched
    group becomes its branch, flattened into its parts (a composition self-composed n times is
    the composition of its parts, each n times), each part merged with the group of the same
    event. So the branch's Gaussians merge into one Gaussian as every other Gaussian does
    (exact), and its counts' DLap group is reused from the cache whatever σ is."""
    out: dict[str, list[Any]] = {}
    for k, e, n in groups:
        parts = (
            [(k, e, 1)]
            if not has_branches(e)
            else [
                (canonical_json(event_to_json(p)), p, c) for p, c in _flatten(branch_of(e, branch))
            ]
        )
        for pk, p, c in parts:
            if pk in out:
                out[pk][1] += n * c
            else:
                out[pk] = [p, n * c]
    return [(k, e, n) for k, (e, n) in out.items()]


def _branched(
    groups: Sequence[tuple[str, dp_event.DpEvent, int]],
    delta: float,
    pld_interval: float,
    cached: bool = True,
) -> float:
    """``_ledger_epsilon``, or with label branches the larger of the two branches' (see
    ``events.LabelBranchDpEvent`` for why the maximum of the compositions is sound)."""
    if not any(has_branches(e) for _, e, _ in groups):
        return _ledger_epsilon(groups, delta, pld_interval, cached)
    return max(
        _ledger_epsilon(branch_groups(groups, b), delta, pld_interval, cached) for b in BRANCHES
    )


def _ledger_epsilon(
    groups: Sequence[tuple[str, dp_event.DpEvent, int]],
    delta: float,
    pld_interval: float,
    cached: bool = True,
) -> float:
    rewritten = [(k, _for_accountant(e, Accountant.PLD), n) for k, e, n in groups]
    gauss = [(k, e, n) for k, e, n in rewritten if _gaussian_equivalent(e) is not None]
    rest = [(k, e, n) for k, e, n in rewritten if _gaussian_equivalent(e) is None]
    events = {k: e for k, e, _ in rest}
    pld = _fold(tuple((k, n) for k, _, n in rest), events, pld_interval, cached)
    if pld is _NOT_DP:
        return math.inf
    if gauss:
        merged = _gaussian_equivalent(
            dp_event.ComposedDpEvent([dp_event.SelfComposedDpEvent(e, n) for _, e, n in gauss])
        )
        if merged == 0:
            return math.inf
        g_event = dp_event.GaussianDpEvent(merged)
        g = _pld_of(f"gaussian:{merged!r}", g_event, 1, pld_interval, cached)
        pld = g if pld is None else pld.compose(g)
    eps = float(pld.get_epsilon_for_delta(delta))
    if any(_has_exponential(e) for _, e, _ in groups):
        # The PLD accountant sees an exponential-mechanism step only as generic ε₀-DP; its
        # bounded range (ε₀²/8-zCDP, Cesar & Rogers 2021) is known to the RDP accountant alone.
        # Both bound ε at δ for the same events, so the smaller bound holds (measured: T = 1000
        # steps calibrated to ε = 1 by RDP are ε = 2.49 to PLD). Ledgers without such steps keep
        # the PLD figure exactly.
        every = [dp_event.SelfComposedDpEvent(e, n) if n > 1 else e for _, e, n in groups]
        eps = min(eps, epsilon_of(every, delta, Accountant.RDP))
    return eps


def _has_exponential(event: dp_event.DpEvent) -> bool:
    if isinstance(event, ExponentialMechanismDpEvent):
        return True
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return _has_exponential(event.event)
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(_has_exponential(e) for e in event.events)
    return False
