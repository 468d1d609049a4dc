"""Privacy accounting: the ε of a list of events, for a table or for the ledger.

Every function here is a function of public parameters (ε, δ, σ, p, steps); the accountants
are ``dpda.dp.accountants``, the calibrations that invert these functions
``dpda.dp.calibration``, and the caches and work bounds they run under
``dpda.dp.work_bounds``. Spend is always
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

import math
from collections.abc import Sequence
from typing import Any

from dp_accounting import dp_event

from dpda.dp.accountants import (
    LEDGER_PLD_INTERVAL,
    TABLE_PLD_INTERVAL,
    Accountant,
    PldAccountant,
    make_accountant,
)
from dpda.dp.events import (
    BRANCHES,
    ExponentialMechanismDpEvent,
    RevealedSampledGaussianDpEvent,
    branch_of,
    canonical_json,
    event_to_json,
    has_branches,
)
from dpda.dp.work_bounds import caches, check_deadline


def check_eps_delta(epsilon: float, delta: float) -> None:
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError("epsilon must be a finite number > 0")
    if not (0 < delta < 1):
        raise ValueError("delta must lie strictly between 0 and 1")


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
    check_deadline()
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
        caches().sampled.get(key, lambda: epsilon_of([event], delta, accountant, pld_interval))
    )


# ----------------------------------------------------------------- the ledger's running spend
# Keyed caches for the ledger: a charge recomposes only what changed. PLDs are immutable, so
# sharing them between calls (and threads) is safe.
_NOT_DP = object()  # a group with no DP guarantee: ε = ∞


def _pld_of(
    key: str, event: dp_event.DpEvent, count: int, interval: float, cached: bool = True
) -> Any:
    """PLD of ``event`` composed ``count`` times (the accountant's own construction); with
    ``cached`` false the same construction, kept out of the shared caches."""

    def make() -> Any:
        acc = PldAccountant(value_discretization_interval=interval)
        ev = event if count == 1 else dp_event.SelfComposedDpEvent(event, count)
        if not acc.supports(ev):
            raise ValueError("the pld accountant does not support this event")
        acc.compose(ev)
        return _NOT_DP if acc.pld is None else acc.pld

    return caches().step.get((key, count, interval), make) if cached else make()


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

    return caches().fold.get((prefix, interval), make) if cached else make()


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
    composition, however long the ledger.
    """
    if not (0 < delta < 1):
        raise ValueError("delta must lie strictly between 0 and 1")
    check_deadline()
    if not groups:
        return 0.0
    # the groups' keys are their events' canonical JSON: equal keys, equal ε (reading ε off a
    # cached PLD still costs 2–3 ms, and a charge reads it for each cap, on both sides)
    key = (tuple((k, n) for k, _, n in groups), delta, pld_interval)
    return float(caches().epsilon.get(key, lambda: branched_epsilon(groups, delta, pld_interval)))


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


def branched_epsilon(
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
        # Both bound ε at δ for the same events, so the smaller bound holds (how far apart they
        # are: docs/privacy-model.md). Ledgers without such steps keep the PLD figure exactly.
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
