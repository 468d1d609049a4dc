"""PATE noisy teacher votes (Papernot et al., ICLR 2017; GNMax, ICLR 2018): the math.

Neighbouring relation: one record of the source changes (added, removed or replaced). Teachers are
trained on *disjoint* parts of the data, so the record moves at most one teacher's vote: the
vote-count vector changes by at most 1 in two coordinates (L1 ≤ 2, L2 ≤ √2). Only the noisy
arg-max leaves the source — post-processing of the noisy counts — never the counts.

Per answered query (data-independent, so both parties can recompute every charge):

* LNMax, Laplace noise of scale ``1/γ`` on each count: the count release is the composition of
  two Laplace mechanisms of sensitivity 1 (the two coordinates that move), i.e.
  ``SelfComposed(LaplaceDpEvent(1/γ), 2)`` — pure ``2γ``-DP, exact under the PLD accountant.
  The 2017 paper's data-independent moments bound, ``α(l) ≤ 2γ²·l(l+1)`` per query and
  ``ε = min_l (T·2γ²·l(l+1) + ln(1/δ)) / l``, is offered by the planner (``--bound moments``).
* GNMax, Gaussian noise ``σ`` on each count: ``GaussianDpEvent(σ/√2)`` (L2 sensitivity √2), whose
  RDP is ``α/σ²`` per query (the 2018 paper's data-independent bound).

The data-dependent (smooth sensitivity) analysis of the papers is not used for the shared charge.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from dp_accounting import dp_event

from dpda.dp.accountants import Accountant
from dpda.dp.accounting import epsilon_of


def query_event(aggregator: str, scale: float) -> dp_event.DpEvent:
    """The ``DpEvent`` of one answered query. ``scale`` is γ (LNMax) or σ (GNMax)."""
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError("the aggregator's noise parameter must be > 0")
    if aggregator == "lnmax":
        return dp_event.SelfComposedDpEvent(dp_event.LaplaceDpEvent(1.0 / scale), 2)
    if aggregator == "gnmax":
        return dp_event.GaussianDpEvent(scale / math.sqrt(2.0))
    raise ValueError(f"unknown aggregator {aggregator!r} (choose lnmax or gnmax)")


def answers_event(aggregator: str, scale: float, n_queries: int) -> dp_event.DpEvent:
    if n_queries < 1:
        raise ValueError("at least one query")
    return dp_event.SelfComposedDpEvent(query_event(aggregator, scale), n_queries)


def lnmax_moments_epsilon(
    gamma: float, queries: int, delta: float, max_order: int = 10_000
) -> float:
    """The 2017 paper's data-independent bound ``min_l (T·2γ²l(l+1) + ln(1/δ)) / l``."""
    if gamma <= 0 or queries < 0 or not (0 < delta < 1):
        raise ValueError("need gamma > 0, queries ≥ 0, 0 < delta < 1")
    log_inv = math.log(1.0 / delta)
    return min(
        (queries * 2 * gamma * gamma * order * (order + 1) + log_inv) / order
        for order in range(1, max_order + 1)
    )


def pate_epsilon(
    aggregator: str,
    scale: float,
    queries: int,
    delta: float,
    bound: str = "pld",
) -> float:
    """ε of ``queries`` answers: ``bound`` is ``pld``, ``rdp`` or (LNMax only) ``moments``."""
    if bound == "moments":
        if aggregator != "lnmax":
            raise ValueError("the moments bound is the LNMax bound of the 2017 paper")
        return lnmax_moments_epsilon(scale, queries, delta)
    return epsilon_of([answers_event(aggregator, scale, queries)], delta, Accountant(bound))


@functools.lru_cache(maxsize=256)
def calibrate_pate(
    aggregator: str, queries: int, epsilon: float, delta: float, pld_interval: float = 1e-3
) -> float:
    """The least noisy parameter (largest γ / smallest σ) keeping ``queries`` answers ≤ ε.

    Bisection that keeps the feasible end, so the result never overshoots ε. A function of
    public terms only, remembered for the process (``functools.lru_cache``): the sessions a
    source opens with the same PATE terms share one calibration, about 0.5 s each otherwise.
    """
    from dpda.dp.accountants import LEDGER_PLD_INTERVAL

    interval = pld_interval or LEDGER_PLD_INTERVAL

    def eps(scale: float) -> float:
        return epsilon_of([answers_event(aggregator, scale, queries)], delta, "pld", interval)

    if aggregator == "lnmax":  # larger γ = less noise
        lo, hi = 1e-6, 10.0  # lo feasible
        for _ in range(60):
            mid = math.sqrt(lo * hi)
            if eps(mid) <= epsilon:
                lo = mid
            else:
                hi = mid
            if hi / lo < 1 + 1e-3:
                break
        return lo
    # GNMax: T answers are exactly one Gaussian with multiplier σ/√(2T); start from the analytic
    # Gaussian σ and bisect upward with the (pessimistic) PLD the ledger uses.
    from dpda.dp.calibration import sigma_analytic

    lo = sigma_analytic(epsilon, delta) * math.sqrt(2.0 * queries) * 0.98
    hi = lo * 1.1
    while eps(hi) > epsilon:
        lo, hi = hi, hi * 1.5
    for _ in range(40):  # invariant: hi feasible
        mid = 0.5 * (lo + hi)
        if eps(mid) <= epsilon:
            hi = mid
        else:
            lo = mid
        if hi / lo < 1 + 1e-4:
            break
    return hi


def noisy_counts(
    votes: np.ndarray, aggregator: str, scale: float, rng: np.random.Generator
) -> np.ndarray:
    """``votes (n, q)`` plus LNMax (Laplace ``1/γ``) or GNMax (Gaussian ``σ``) noise."""
    if aggregator == "lnmax":
        return votes + rng.laplace(0.0, 1.0 / scale, size=votes.shape)
    if aggregator == "gnmax":
        return votes + rng.normal(0.0, scale, size=votes.shape)
    raise ValueError(f"unknown aggregator {aggregator!r}")


def noise_std(aggregator: str, scale: float) -> float:
    """Standard deviation of the noise on each count (for the statistical tests)."""
    return math.sqrt(2.0) / scale if aggregator == "lnmax" else scale


def noisy_argmax(
    votes: np.ndarray, aggregator: str, scale: float, rng: np.random.Generator
) -> np.ndarray:
    """``(n,)`` labels: the arg-max of the noisy counts. Only this leaves the source."""
    labels: np.ndarray = np.argmax(noisy_counts(votes, aggregator, scale, rng), axis=1)
    return labels.astype(np.int64)
