"""dp-accounting's accountants, extended with the project's own events.

``RevealedSampledGaussianDpEvent`` (the attribute relation's sampled step) gets its exact PLD
and RDP here; ``ExponentialMechanismDpEvent`` is ε₀-DP to the PLD accountant. Before composing,
the PLD accountant checks the size of what it is about to make against the thread's bound
(``work_bounds.check_pld_points``), so a plan cannot start a composition of gigabytes.

The subclasses use the accountants' ``_maybe_compose`` hook and ``_pld`` state, which are not
public API: the project pins dp-accounting to the version they are written for
(``pyproject.toml``), and ``tests/unit/dp/test_accounting.py`` checks that version and the
results of library events.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from enum import StrEnum

import dp_accounting
import numpy as np
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant, privacy_loss_distribution
from dp_accounting.rdp import rdp_privacy_accountant

from dpda.dp.events import ExponentialMechanismDpEvent, RevealedSampledGaussianDpEvent
from dpda.dp.work_bounds import check_pld_points, gaussian_pld_points


class Accountant(StrEnum):
    PLD = "pld"
    RDP = "rdp"


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


@functools.lru_cache(maxsize=32)  # as above: the searches over a step count share one
def sampled_gaussian_pld(
    sigma: float,
    sampling_rate: float,
    pld_interval: float,
    relation: dp_accounting.NeighboringRelation,
) -> privacy_loss_distribution.PrivacyLossDistribution:
    """PLD of ONE Poisson-sampled Gaussian step, built exactly as dp-accounting's
    ``PLDAccountant`` builds it for a ``PoissonSampledDpEvent`` of a ``GaussianDpEvent`` (the
    same call and arguments). Building it is most of a composition's cost; a search over the
    step count (``calibration.largest_count``) asks for the same step at every count, so it is
    built once and self-composed for each."""
    return privacy_loss_distribution.from_gaussian_mechanism(
        standard_deviation=sigma,
        value_discretization_interval=pld_interval,
        sampling_prob=sampling_rate,
        neighboring_relation=relation,
    )


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


class PldAccountant(pld_privacy_accountant.PLDAccountant):
    """dp-accounting's PLD accountant, plus ``RevealedSampledGaussianDpEvent``.

    Every other event (and the Composed / SelfComposed traversal, which dispatches back here)
    is handled by the library unchanged, after the size of a Gaussian part's composition is
    checked against the thread's bound (``check_pld_points``).
    """

    _pld: privacy_loss_distribution.PrivacyLossDistribution

    @property
    def pld(self) -> privacy_loss_distribution.PrivacyLossDistribution | None:
        """The composed PLD; None when a composed event has no DP guarantee."""
        return None if self._contains_non_dp_event else self._pld

    def _maybe_compose(
        self, event: dp_event.DpEvent, count: int, do_compose: bool
    ) -> dp_accounting.PrivacyAccountant.CompositionErrorDetails | None:
        if do_compose and count > 0:
            got = _gaussian_multiplier(event)
            if got is not None:
                interval = self._value_discretization_interval
                sigma, sampled, rate = got
                revealed = isinstance(event, RevealedSampledGaussianDpEvent)
                points = gaussian_pld_points(sigma, count, interval, sampled, rate, revealed)
                check_pld_points(points)
        if isinstance(event, RevealedSampledGaussianDpEvent):
            if do_compose and count > 0:
                step = revealed_sampled_gaussian_pld(
                    event.noise_multiplier,
                    event.sampling_probability,
                    self._value_discretization_interval,
                )
                self._pld = self._pld.compose(step.self_compose(count))
            return None
        if (
            isinstance(event, dp_event.PoissonSampledDpEvent)
            and isinstance(event.event, dp_event.GaussianDpEvent)
            and event.sampling_probability > 0
            and event.event.noise_multiplier > 0
        ):  # the library's own PLD for it, remembered (``sampled_gaussian_pld``)
            if do_compose:  # a count below 1 raises in ``self_compose``, as in the library
                step = sampled_gaussian_pld(
                    float(event.event.noise_multiplier),
                    float(event.sampling_probability),
                    self._value_discretization_interval,
                    self.neighboring_relation,
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


def _gaussian_multiplier(event: dp_event.DpEvent) -> tuple[float, bool, float] | None:
    """(σ, sampled, sampling rate) of a Gaussian step, plain or sampled, else None."""
    if isinstance(event, dp_event.GaussianDpEvent):
        return float(event.noise_multiplier), False, 1.0
    if isinstance(event, RevealedSampledGaussianDpEvent):
        return float(event.noise_multiplier), True, float(event.sampling_probability)
    if isinstance(event, dp_event.PoissonSampledDpEvent) and isinstance(
        event.event, dp_event.GaussianDpEvent
    ):
        return float(event.event.noise_multiplier), True, float(event.sampling_probability)
    return None


class RdpAccountant(rdp_privacy_accountant.RdpAccountant):
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
        return PldAccountant(value_discretization_interval=pld_interval)
    return RdpAccountant()
