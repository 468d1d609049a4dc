"""Release specifications: what is released, its sensitivity and its noise, as frozen records.

A *spec* is decided before any noise is drawn, from public parameters only, and turns into the
``dp_accounting.DpEvent`` that the ledger charges. The release that follows must use exactly the
spec's noise (tests compare the noise drawn with the spec).

Format compatibility: ``event_to_json`` / ``event_from_json`` write ``{"type": <DpEvent class>,
...fields}``. New fields may be added with defaults; a field is never renamed or reinterpreted;
an unknown ``type`` is an error (refuse rather than under-charge).

Mechanisms
----------
``FeatureSpec`` — Gaussian release of ``Z = X·M + Δ``, ``Δ ~ N(0, (σ·S)²)^{n×ℓ}`` with ``S`` the L2
sensitivity of one row (``projection_sensitivity``) and ``σ`` the noise multiplier; with
``steps = T`` > 1, T adaptively chosen Gaussian queries of that σ and sensitivity
(``SelfComposed(Gaussian(σ), T)``, exactly one Gaussian of multiplier σ/√T).

``HistogramSpec`` — label counts ``v(y) + η``; whole-batch: ``η ~ DLap(a)``, pure ``(a·Δ₁)``-DP;
minibatch: ``η ~ N(0, (σ_h·Δ₁)²)`` rounded (post-processing), so that a batch's two outputs form
one Gaussian mechanism that Poisson amplification can be applied to exactly.

``BatchSpec`` — a feature and a histogram release of the same rows. Whole batch: the
composition of both events. Poisson-subsampled with rate ``p``: ``PoissonSampled(p,
Composed(Gaussian(σ_f), Gaussian(σ_h)))``, which equals one sampled Gaussian with multiplier
``(σ_f⁻² + σ_h⁻²)^(-1/2)`` (``accounting._gaussian_equivalent``).

``BatchSpec`` of a record-unit aggregate release (prototypes, class-gaussians) under replace-one:
the joint mechanism, ``LabelBranchDpEvent`` (same-label branch: the sums' Gaussian alone;
label-change branch: the sums' Gaussian at the cross-class sensitivity and one DLap(a) per moved
count). The noise drawn is the same as for the composition: ``N(0, (σ·S_same)²)`` per sums
coordinate and ``DLap(a)`` per count.

``MetricSpec`` — the learned ground cost (``dpda.dp.metric``): ``T`` full-batch Gaussian steps
on the clipped pair-gradient sum, sensitivity ``2mG`` (replace-one), noise ``N(0, (σ·2mG)²)``;
``SelfComposed(Gaussian(σ), T)``.

``RevealedSampledGaussianDpEvent`` — one Poisson-sampled Gaussian step accounted under the
*attribute* relation, where sampling is revealed and amplifies δ but not ε (see its docstring).

``LabelBranchDpEvent`` — one release whose worst case depends on whether the replaced record keeps
its label; the ledger takes the worst branch of the whole composition (see its docstring).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from typing import Any

import attr
from dp_accounting import dp_event

from dpda.dp.mechanisms import PrivacyUnit


@dataclass(frozen=True)
class FeatureSpec:
    noise_multiplier: float  # σ per unit of L2 sensitivity
    sensitivity: float  # L2 sensitivity of one row (unit and relation folded in)
    unit: str
    relation: str
    # Gaussian steps of this σ on the same records (sinkhorn-synthetic: T noisy gradient sums,
    # adaptively chosen); 1 for every other release. Added with a default: older entries read 1.
    steps: int = 1
    # L2 sensitivity of the released vector when the replaced record changes label (two classes
    # move together; prototypes √2·C, class-gaussians 2), for record-unit aggregate releases
    # under replace-one; ``sensitivity`` is then the same-label one. None: no label branch (the
    # charge is the composition). Added with a default: older entries read None.
    label_change_sensitivity: float | None = None

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise of each step, per coordinate."""
        return self.noise_multiplier * self.sensitivity

    def dp_event(self) -> dp_event.DpEvent:
        one = dp_event.GaussianDpEvent(self.noise_multiplier)
        return one if self.steps == 1 else dp_event.SelfComposedDpEvent(one, self.steps)


@dataclass(frozen=True)
class HistogramSpec:
    mechanism: str  # "discrete_laplace" | "gaussian"
    parameter: float  # DLap parameter a, or Gaussian noise multiplier σ_h
    sensitivity: int  # L1 sensitivity (1, or 2 under replace-one)

    def __post_init__(self) -> None:
        if self.mechanism not in ("discrete_laplace", "gaussian"):
            raise ValueError("unknown histogram mechanism")

    @property
    def noise_std(self) -> float:
        """Standard deviation of the noise on each count (for the statistical tests)."""
        if self.mechanism == "gaussian":
            return self.parameter * self.sensitivity
        from dpda.dp.mechanisms import discrete_laplace_variance

        return float(discrete_laplace_variance(self.parameter) ** 0.5)

    def dp_event(self) -> dp_event.DpEvent:
        if self.mechanism == "discrete_laplace":
            # DLap(a) on counts of L1 sensitivity Δ: the library takes (a, Δ) directly.
            return dp_event.DiscreteLaplaceDpEvent(self.parameter, self.sensitivity)
        # Gaussian on counts: L1 = L2 sensitivity for a one-hot change (and ≤ √2·... under
        # replace-one, where L2 = √2 < Δ₁ = 2: using Δ₁ is conservative).
        return dp_event.GaussianDpEvent(self.parameter)


@dataclass(frozen=True)
class BatchSpec:
    features: FeatureSpec
    histogram: HistogramSpec
    sampling_rate: float | None = None  # None: the whole dataset, every row once

    def __post_init__(self) -> None:
        unit = PrivacyUnit(self.features.unit)
        if self.sampling_rate is not None:
            if not (0 < self.sampling_rate <= 1):
                raise ValueError("sampling rate must lie in (0, 1]")
            if self.histogram.mechanism != "gaussian":
                raise ValueError("Poisson-sampled batches need a Gaussian histogram")
            if unit is not PrivacyUnit.ATTRIBUTE:
                raise ValueError(
                    "Poisson-sampled per-row releases are offered under the attribute unit only"
                )

    def dp_event(self) -> dp_event.DpEvent:
        """The charged event.

        Attribute unit: only the feature Gaussian. The record and its label are in both
        neighbours, so the histogram does not change and costs nothing; Poisson sampling is
        revealed (the record's row is identifiable), so it amplifies δ, not ε
        (``RevealedSampledGaussianDpEvent``). Record unit (whole batch only): the joint
        mechanism (``LabelBranchDpEvent``) for the aggregates that carry a label-change
        sensitivity (``joint``), else features and histogram composed.
        """
        if PrivacyUnit(self.features.unit) is PrivacyUnit.ATTRIBUTE:
            if self.sampling_rate is None:
                return self.features.dp_event()
            return RevealedSampledGaussianDpEvent(
                self.features.noise_multiplier, self.sampling_rate
            )
        if self.joint:
            return self._joint_event()
        return dp_event.ComposedDpEvent([self.features.dp_event(), self.histogram.dp_event()])

    @property
    def joint(self) -> bool:
        """Whether the charge is the joint mechanism (``LabelBranchDpEvent``): a record-unit
        whole-dataset aggregate with a label-change sensitivity, one Gaussian step and DLap
        counts of L1 sensitivity 2 (replace-one)."""
        f, h = self.features, self.histogram
        return (
            f.label_change_sensitivity is not None
            and self.sampling_rate is None
            and f.steps == 1
            and h.mechanism == "discrete_laplace"
            and h.sensitivity == 2
        )

    def _joint_event(self) -> LabelBranchDpEvent:
        """Same label: the record's class sums move by ≤ ``sensitivity`` = S_same and no count
        moves, so the Gaussian of multiplier σ alone. Label change: two classes' sums move by
        ≤ S_cross together (L2) and two counts by 1 each, so the Gaussian at multiplier
        σ·S_same/S_cross (the noise is σ·S_same per coordinate) composed with two DLap(a)
        mechanisms of sensitivity 1 — the exact privacy loss of two independent counts that
        each move by one (tighter than one count moving by 2, ``DiscreteLaplace(a, 2)``)."""
        f, h = self.features, self.histogram
        cross = f.label_change_sensitivity
        if cross is None or not (math.isfinite(cross) and cross > 0):
            raise ValueError("the label-change sensitivity must be a finite number > 0")
        count = dp_event.DiscreteLaplaceDpEvent(h.parameter, 1)
        return LabelBranchDpEvent(
            same_label=dp_event.GaussianDpEvent(f.noise_multiplier),
            label_change=dp_event.ComposedDpEvent(
                [
                    dp_event.GaussianDpEvent(f.noise_multiplier * f.sensitivity / cross),
                    count,
                    count,
                ]
            ),
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MetricSpec:
    """The metric release of a session (``dpda.dp.metric``): W, d′ × ℓ."""

    noise_multiplier: float  # σ of each step, per unit of sensitivity
    sensitivity: float  # 2mG: Frobenius sensitivity of the clipped gradient sum (replace-one)
    steps: int  # T full-batch steps
    unit: str
    relation: str
    kind: str = "metric"

    @property
    def noise_std(self) -> float:
        """Standard deviation of each step's noise, per coordinate of the gradient sum."""
        return self.noise_multiplier * self.sensitivity

    def dp_event(self) -> dp_event.DpEvent:
        one = dp_event.GaussianDpEvent(self.noise_multiplier)
        return one if self.steps == 1 else dp_event.SelfComposedDpEvent(one, self.steps)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _check_noise_multiplier(instance: Any, attribute: Any, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a real number")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a finite number > 0")


def _check_sampling_probability(instance: Any, attribute: Any, value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{attribute.name} must be a real number")
    if not (0 < value <= 1):
        raise ValueError(f"{attribute.name} must lie in (0, 1]")


@attr.define(frozen=True)
class RevealedSampledGaussianDpEvent(dp_event.DpEvent):
    """One Poisson-sampled Gaussian step whose sampling outcome is revealed (attribute privacy).

    Relation. Neighbouring datasets differ in *one feature of one record*; the record itself is
    in both. A step puts each row in the batch independently with probability
    ``sampling_probability`` = p and releases the batch with Gaussian noise of multiplier
    ``noise_multiplier`` = σ (per unit of L2 sensitivity; the caller folds the attribute
    sensitivity into σ).

    Why sampling amplifies δ, not ε. Whether the record is in the batch is decided by the same
    coin in both neighbours, and the record's noisy row is identifiable by its unchanged
    features, so the coin is part of the output. The step is therefore a *revealed* mixture:
    with probability 1 − p the record is absent and both neighbours give the same output
    (privacy loss 0, the identity PLD); with probability p it is present and the step is a
    Gaussian mechanism of sensitivity 1 and standard deviation σ. With the coin revealed the
    hockey-stick divergence mixes linearly,

        δ_step(ε) = p · δ_Gauss(ε; μ = 1/σ),

    so p scales δ but the ε of a given tail is that of the un-sampled Gaussian (compare
    add/remove amplification, ε ≈ log(1 + p(e^ε₀ − 1))). After T steps the number K of steps
    that contained the record is Binomial(T, p) and revealed, and the exact profile is

        δ(ε) = Σ_{K=1}^{T} Bin(K; T, p) · δ_Gauss(ε; √K / σ),
        δ_Gauss(ε; μ) = Φ(−ε/μ + μ/2) − e^ε · Φ(−ε/μ − μ/2).

    Per step Rényi DP of order α: ε_α = log(1 − p + p · exp(α(α − 1)/(2σ²))) / (α − 1).

    T steps are ``SelfComposedDpEvent(RevealedSampledGaussianDpEvent(σ, p), T)``;
    ``dpda.dp.accounting.epsilon_of`` accounts it under both PLD and RDP.
    """

    noise_multiplier: float = attr.field(validator=_check_noise_multiplier)
    sampling_probability: float = attr.field(validator=_check_sampling_probability)


@attr.define(frozen=True)
class ExponentialMechanismDpEvent(dp_event.DpEvent):
    """One selection by the exponential mechanism at ``epsilon`` = ε: ``P(i) ∝ exp(ε·u_i/(2Δ))``
    for a utility of sensitivity Δ (report-noisy-max with Gumbel noise is the same sampler).

    It is ε-DP and has bounded range ε, hence ε²/8-zCDP (Cesar & Rogers 2021).
    ``dpda.dp.accounting`` accounts it under PLD as the worst case of *any* ε-DP mechanism
    (``from_privacy_parameters(ε, 0)``: valid, not tight for bounded range) and under RDP as
    ``min(ε, α·ε²/8)`` per order α (both bounds hold, so their minimum does).
    """

    epsilon: float = attr.field(validator=_check_noise_multiplier)


def _check_branch(instance: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, dp_event.DpEvent):
        raise TypeError(f"{attribute.name} must be a DpEvent")
    if has_branches(value):
        raise ValueError(f"{attribute.name} must not hold another LabelBranchDpEvent")


#: The branches of ``LabelBranchDpEvent``, by field name: does the replaced record keep its label.
BRANCHES: tuple[str, ...] = ("same_label", "label_change")


@attr.define(frozen=True)
class LabelBranchDpEvent(dp_event.DpEvent):
    """One release whose worst case depends on whether the replaced record keeps its label.

    Relation. Replace one record (the record unit's relation). A neighbouring pair (D, D′) is
    of exactly one of two kinds: the replaced record keeps its label (``same_label``) or takes
    another (``label_change``). ``same_label`` is an event that dominates the release on every
    pair of the first kind, ``label_change`` on every pair of the second; neither needs to
    dominate the other kind's pairs.

    Aggregate releases (``BatchSpec`` with a label-change sensitivity). Noisy per-class sums
    ``S + N(0, (σ·S_same)²)`` per coordinate and noisy counts ``v + DLap(a)`` per class. Same
    label: one class's sums move by ≤ S_same (prototypes 2C; class-gaussians 3/√2), no count
    moves — ``Gaussian(σ)``. Label change: the old class loses the row and the new one gains
    the other, ≤ S_cross in L2 together (prototypes √2·C; class-gaussians 2), and the two counts
    move by 1 each — ``Composed(Gaussian(σ·S_same/S_cross), DLap(a, 1), DLap(a, 1))``. The
    composition ``Composed(Gaussian(σ), DLap(a, 2))`` charged before adds the worst case of
    the sums (same label) to the worst case of the counts (label change), which no pair has.

    Accounting. The ledger's ε of a list of events is the maximum over the branches b of the ε
    of the composition in which every ``LabelBranchDpEvent`` is replaced by its branch b and
    every other event stays as it is (``accounting.ledger_epsilon``, ``accounting.epsilon_of``).

    Why that is sound for composition. The branch is a property of the neighbouring pair
    (D, D′), not of a release: every release of the dataset sees the same pair, so on a pair of
    kind b each release's privacy loss is dominated by its branch-b event (an event without
    branches dominates every pair), and the (adaptive) composition of dominated mechanisms is
    dominated by the composition of the dominating events (Zhu, Dong & Wang 2022). The pair's
    hockey-stick divergence at e^ε is therefore at most that of the branch-b composition; DP is
    the supremum over pairs, so the maximum over the two kinds bounds it. Mixing branches across
    releases (same label in one, label change in another) would bound pairs that do not exist.

    Why it is exact for one release. Both worst cases are attained with the sums and the counts
    at their worst together: same label, a row x with ‖x‖ = C replaced by −x (prototypes; the
    class-gaussians maximiser is in ``mechanisms.class_gaussians_sensitivity``); label change,
    a row of norm C (class-gaussians: C·e₁) of class A replaced by another such row of class
    B: A's block and B's block each move by their maximum (C; class-gaussians √2), and both
    counts by one. Up to the PLD's pessimistic discretisation, the larger of the two branches'
    ε(δ) is the release's ε(δ).

    Under add/remove there is no branch: one class's sums and its count move together, and
    the composition is the exact joint worst case. Serialised as ``{"type":
    "LabelBranchDpEvent", "same_label": {...}, "label_change": {...}}``; a branch never nests
    another ``LabelBranchDpEvent``.
    """

    same_label: dp_event.DpEvent = attr.field(validator=_check_branch)
    label_change: dp_event.DpEvent = attr.field(validator=_check_branch)


def has_branches(event: dp_event.DpEvent) -> bool:
    """Whether ``event`` holds a ``LabelBranchDpEvent`` anywhere inside it."""
    if isinstance(event, LabelBranchDpEvent):
        return True
    if isinstance(event, dp_event.ComposedDpEvent):
        return any(has_branches(e) for e in event.events)
    if isinstance(event, dp_event.SelfComposedDpEvent | dp_event.PoissonSampledDpEvent):
        return has_branches(event.event)
    return False


def branch_of(event: dp_event.DpEvent, branch: str) -> dp_event.DpEvent:
    """``event`` with every ``LabelBranchDpEvent`` replaced by its ``branch`` (one of
    ``BRANCHES``); events without branches come back unchanged (the same object)."""
    if branch not in BRANCHES:
        raise ValueError(f"unknown branch {branch!r}")
    if not has_branches(event):
        return event
    if isinstance(event, LabelBranchDpEvent):
        chosen: dp_event.DpEvent = getattr(event, branch)
        return chosen
    if isinstance(event, dp_event.ComposedDpEvent):
        return dp_event.ComposedDpEvent([branch_of(e, branch) for e in event.events])
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return dp_event.SelfComposedDpEvent(branch_of(event.event, branch), event.count)
    assert isinstance(event, dp_event.PoissonSampledDpEvent)
    return dp_event.PoissonSampledDpEvent(
        event.sampling_probability, branch_of(event.event, branch)
    )


# ---------------------------------------------------------------- DpEvent (de)serialization
_LEAVES: dict[str, type] = {
    # a recorded disclosure that costs nothing (post-processing of released values: the
    # target's synthetic PATE queries); composes as the identity
    "NoOpDpEvent": dp_event.NoOpDpEvent,
    "GaussianDpEvent": dp_event.GaussianDpEvent,
    "LaplaceDpEvent": dp_event.LaplaceDpEvent,
    "DiscreteLaplaceDpEvent": dp_event.DiscreteLaplaceDpEvent,
    "ZCDpEvent": dp_event.ZCDpEvent,
    "RevealedSampledGaussianDpEvent": RevealedSampledGaussianDpEvent,
    "ExponentialMechanismDpEvent": ExponentialMechanismDpEvent,
}


def event_to_json(event: dp_event.DpEvent) -> dict[str, Any]:
    name = type(event).__name__
    if isinstance(event, dp_event.ComposedDpEvent):
        return {"type": name, "events": [event_to_json(e) for e in event.events]}
    if isinstance(event, dp_event.SelfComposedDpEvent):
        return {"type": name, "event": event_to_json(event.event), "count": event.count}
    if isinstance(event, dp_event.PoissonSampledDpEvent):
        return {
            "type": name,
            "sampling_probability": event.sampling_probability,
            "event": event_to_json(event.event),
        }
    if isinstance(event, LabelBranchDpEvent):
        return {"type": name, **{b: event_to_json(getattr(event, b)) for b in BRANCHES}}
    if name in _LEAVES:
        fields = {a.name: getattr(event, a.name) for a in attr.fields(type(event))}
        return {"type": name, **fields}
    raise ValueError(f"event type {name} is not supported by the ledger")


def event_from_json(data: dict[str, Any]) -> dp_event.DpEvent:
    kind = data.get("type")
    if kind == "ComposedDpEvent":
        return dp_event.ComposedDpEvent([event_from_json(e) for e in data["events"]])
    if kind == "SelfComposedDpEvent":
        return dp_event.SelfComposedDpEvent(event_from_json(data["event"]), int(data["count"]))
    if kind == "PoissonSampledDpEvent":
        return dp_event.PoissonSampledDpEvent(
            float(data["sampling_probability"]), event_from_json(data["event"])
        )
    if kind == "LabelBranchDpEvent":
        if set(data) != {"type", *BRANCHES}:
            raise ValueError("a LabelBranchDpEvent has exactly the fields of its two branches")
        return LabelBranchDpEvent(*(event_from_json(data[b]) for b in BRANCHES))
    if kind in _LEAVES:
        fields = {k: v for k, v in data.items() if k != "type"}
        return _LEAVES[kind](**fields)
    raise ValueError("unknown DpEvent type in ledger entry")


def canonical_json(data: Any) -> str:
    """Deterministic JSON used for hashing and signing."""
    return json.dumps(data, sort_keys=True, separators=(",", ":"), allow_nan=False)
