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
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import StrEnum

import dp_accounting
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.rdp import rdp_privacy_accountant

# Relative safety margin used when rounding σ up after a root-finder: it makes the
# "never overshoots" property hold despite the root-finder's tolerance.
_SIGMA_ROUND_UP = 1e-9


class Accountant(StrEnum):
    PLD = "pld"
    RDP = "rdp"


class CalibrationMethod(StrEnum):
    THEOREM2 = "theorem2"
    ANALYTIC = "analytic"


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
    return sigma


def calibrate_sigma(epsilon: float, delta: float, method: CalibrationMethod | str) -> float:
    method = CalibrationMethod(method)
    if method is CalibrationMethod.THEOREM2:
        return sigma_theorem2(epsilon, delta)
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
    if any(e.noise_multiplier == 0 for e, _ in parts):  # type: ignore[attr-defined]
        return 0.0  # a noiseless release: not private at all
    inv = sum(c / (e.noise_multiplier**2) for e, c in parts)  # type: ignore[attr-defined]
    return math.inf if inv == 0 else 1.0 / math.sqrt(inv)


def _for_accountant(event: dp_event.DpEvent, accountant: Accountant) -> dp_event.DpEvent:
    """Rewrite an event into one the chosen accountant supports, exactly or conservatively.

    * PLD: a Poisson-sampled composition of Gaussians becomes one sampled Gaussian (exact).
    * RDP: a discrete Laplace with pure ε is replaced by ρ = ε²/2 zCDP (Bun & Steinke 2016,
      Prop. 1.4), a valid upper bound; dp-accounting's RDP accountant has no discrete Laplace.
    """
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


def make_accountant(
    accountant: Accountant | str, pld_interval: float = TABLE_PLD_INTERVAL
) -> dp_accounting.PrivacyAccountant:
    accountant = Accountant(accountant)
    if accountant is Accountant.PLD:
        return pld_privacy_accountant.PLDAccountant(value_discretization_interval=pld_interval)
    return rdp_privacy_accountant.RdpAccountant()


def epsilon_of(
    events: Sequence[dp_event.DpEvent],
    delta: float,
    accountant: Accountant | str = "pld",
    pld_interval: float = TABLE_PLD_INTERVAL,
) -> float:
    """ε at ``delta`` of the composition of ``events`` (add-or-remove-one accounting)."""
    if not (0 < delta < 1):
        raise ValueError("delta must lie strictly between 0 and 1")
    acc_kind = Accountant(accountant)
    if not events:
        return 0.0
    acc = make_accountant(acc_kind, pld_interval)
    rewritten = [_for_accountant(e, acc_kind) for e in events]
    if acc_kind is Accountant.PLD:
        # Exact: all un-sampled Gaussian parts about the same record are one Gaussian mechanism.
        gauss = [e for e in rewritten if _gaussian_equivalent(e) is not None]
        if len(gauss) > 1 or any(isinstance(e, dp_event.SelfComposedDpEvent) for e in gauss):
            merged = _gaussian_equivalent(dp_event.ComposedDpEvent(gauss))
            rest = [e for e in rewritten if _gaussian_equivalent(e) is None]
            rewritten = [*rest, dp_event.GaussianDpEvent(merged)]  # type: ignore[arg-type]
    composed = dp_event.ComposedDpEvent(rewritten)
    if not acc.supports(composed):
        raise ValueError(f"the {acc_kind.value} accountant does not support this event")
    acc.compose(composed)
    return float(acc.get_epsilon(delta))


def sampled_gaussian_epsilon(
    sigma: float,
    sampling_rate: float,
    steps: int,
    delta: float,
    accountant: Accountant | str,
    pld_interval: float = TABLE_PLD_INTERVAL,
) -> float:
    """ε of ``steps`` Poisson-subsampled Gaussian releases (rate p, multiplier σ)."""
    if sigma <= 0 or not math.isfinite(sigma):
        raise ValueError("sigma must be a finite number > 0")
    if not (0 < sampling_rate <= 1):
        raise ValueError("sampling rate must lie in (0, 1]")
    if steps < 0:
        raise ValueError("steps must be ≥ 0")
    if steps == 0:
        return 0.0
    event = dp_event.SelfComposedDpEvent(
        dp_event.PoissonSampledDpEvent(sampling_rate, dp_event.GaussianDpEvent(sigma)), steps
    )
    return epsilon_of([event], delta, accountant, pld_interval)


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

    if not ok(1):
        return 0
    lo, hi = 1, 2
    while ok(hi):
        lo, hi = hi, hi * 2
        if hi > 10_000_000:
            return lo
    while hi - lo > 1:  # invariant: ok(lo), not ok(hi)
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


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
