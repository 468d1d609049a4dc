"""The data holder's privacy policy (docs/privacy-model.md, "The data holder's policy"): what
the source allows, per dataset.

The party whose data it is owns its privacy. Session terms only *ask*; the source's policy, read
from its own config, decides. A request outside the policy is refused before anything is charged,
with a message that names the field and the policy's value (both public metadata).

What each knob means, in the source's own units:

* ``units``: the privacy units the source offers. ``record`` (the default) protects a whole record
  (features and label) under *replace one record*. ``attribute`` protects only a change of one
  feature of one record by at most ``attribute_bound``, measured in the source's per-row
  representation (after the per-row transform, before any scaling the target sends). It protects
  neither labels nor membership: rows are released sorted by label, and knowing only a record's own
  features an adversary reads its label off the nearest noisy row (``dpda bench label-leak``;
  docs/privacy-model.md gives the rates). So the attribute unit needs the explicit opt-in
  ``attribute_unit_exposes_labels_and_membership = true``.
* ``neighbouring``: ``replace-one`` only. The source discloses exact sizes (``n_rows``; a whole
  batch has exactly ``ns`` rows), so add/remove neighbours differ visibly in size and the only
  meaningful neighbours are same-size ones: every record-level release is accounted under
  replace-one, with its doubled sensitivities.
* ``releases``: the release kinds offered. Default: the record-level releases (per-class noisy
  sums and counts, and DP-Sinkhorn synthetic points), which protect whole records. ``rows``
  (noisy per-row projections) must be listed explicitly.
* floors: no mechanism runs below ``min_noise_multiplier`` (Gaussian σ per unit of sensitivity),
  ``min_histogram_parameter`` (discrete-Laplace ``a``; never below the exact sampler's own floor),
  ``min_pate_sigma`` (GNMax) or above ``max_pate_gamma`` (LNMax).
* bounds on what the target sends (its column scaling, the clip norm): chosen so that no
  intermediate of the release can overflow; values outside them are refused, never clamped.
* ``max_synthetic_work``: the most work one sinkhorn-synthetic release may ask of the source
  (``synthetic_work``: steps × rows × points × (ℓ + 32), plus the debiasing plans); more is
  refused.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from dpda.dp.mechanisms import AGGREGATE_RELEASES, MIN_DISCRETE_LAPLACE_PARAMETER, ReleaseKind
from dpda.dp.metric import metric_memory, metric_work

Unit = Literal["attribute", "record"]
Release = ReleaseKind

# Bounds on the target's column scaling (its own statistics, sent to the source). With |mean| ≤
# 1e9 and std ≥ 1e-9 a finite source value stays finite through (x − mean) / std up to ~1e290;
# the source clamps beyond 1e100 anyway (see ``features.prepare_features``).
SCALING_MEAN_MAX = 1e9
SCALING_STD_RANGE = (1e-9, 1e9)


class PrivacyPolicy(BaseModel):
    """One dataset's policy; frozen, unknown keys rejected. The defaults protect whole records."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    units: tuple[Unit, ...] = Field(default=("record",), min_length=1)
    attribute_unit_exposes_labels_and_membership: bool = Field(
        default=False,
        description="opt-in for the attribute unit: it protects one feature value only, "
        "neither the record's label nor its membership",
    )
    releases: tuple[Release, ...] = Field(default=AGGREGATE_RELEASES, min_length=1)  # type: ignore[arg-type]
    attribute_bound: float = Field(
        default=1.0,
        gt=0,
        le=1e6,
        description="attribute unit: the change of one feature of one record it protects, in "
        "the source's per-row representation",
    )
    neighbouring: Literal["replace-one"] = "replace-one"
    allow_minibatches: bool = True
    allow_pate: bool = True
    max_session_epsilon: float | None = Field(default=None, gt=0)
    min_noise_multiplier: float = Field(default=0.1, gt=0)
    min_histogram_parameter: float = Field(default=MIN_DISCRETE_LAPLACE_PARAMETER, gt=0)
    min_pate_sigma: float = Field(default=1.0, gt=0)
    max_pate_gamma: float = Field(default=10.0, gt=0)
    clip_norm_range: tuple[float, float] = (1e-6, 1e6)
    # the share of a session's ε the source's DP standardization may take (terms ask)
    preprocessing_share_range: tuple[float, float] = (0.02, 0.3)
    # sinkhorn-synthetic: the source's own bound on one release's work, in multiply-adds of its
    # gradient steps (``synthetic_work``); the release runs under the daemon's lock, so a peer
    # must not be able to ask for minutes of it (its time at the bound: docs/results.md, "DP
    # synthetic points through a Sinkhorn loss"; the default terms ask about 5e7)
    max_synthetic_work: float = Field(default=4e8, gt=0)
    # the learned ground cost (``dpda.dp.metric``): a record-level release (whole
    # records, replace-one, an exact Gaussian charge) of a new kind, reading the labels: an
    # opt-in, as reweighting, so that an existing source does not start offering it on upgrade;
    # its work is bounded (``metric_work``: at the default bound about a second on one core)
    allow_metric: bool = False
    max_metric_work: float = Field(default=2e9, gt=0)
    # ... and its memory (``metric_memory``): the work bound alone allowed tens of GB at ℓ = 1
    max_metric_bytes: float = Field(default=2**30, gt=0)
    # the public-source deployment: this daemon's rows are the private target of a peer's
    # reweighting; every step reads them through their clipped second moment only
    allow_reweighting: bool = False  # an opt-in: a new kind of release of these rows
    # one ReweightSteps request's work, in multiply-adds (``reweighting_work``)
    max_reweighting_work: float = Field(default=4e8, gt=0)

    @model_validator(mode="after")
    def _opt_in(self) -> PrivacyPolicy:
        if "attribute" in self.units and not self.attribute_unit_exposes_labels_and_membership:
            raise ValueError(
                "units: 'attribute' protects neither labels nor membership; allow it only with "
                "attribute_unit_exposes_labels_and_membership = true"
            )
        if self.min_histogram_parameter < MIN_DISCRETE_LAPLACE_PARAMETER:
            raise ValueError(
                "min_histogram_parameter: below the exact sampler's floor "
                f"{MIN_DISCRETE_LAPLACE_PARAMETER:g}"
            )
        lo, hi = self.clip_norm_range
        if not (0 < lo <= hi < 1e100):
            raise ValueError("clip_norm_range: need 0 < low ≤ high < 1e100")
        return self

    @classmethod
    def rehearsal(cls, unit: str, release: str, attribute_bound: float = 1.0) -> PrivacyPolicy:
        """The policy of an in-process rehearsal in which the user plays both parties: it allows
        what the user asked for (the opt-in is the user's own flag), nothing else."""
        return cls(
            units=(unit,),  # type: ignore[arg-type]
            attribute_unit_exposes_labels_and_membership=unit == "attribute",
            releases=(release,),  # type: ignore[arg-type]
            attribute_bound=attribute_bound,
            allow_metric=True,  # asked for by the user's own cost = metric
        )


def _refuse(message: str) -> None:
    from dpda.errors import PolicyRefused

    raise PolicyRefused(message)


def check_terms(policy: PrivacyPolicy, terms: Any, *, allow_raw_queries: bool = False) -> None:
    """Refuse terms outside the policy (before anything is computed or charged).

    ``terms`` is a ``dpda.terms.SessionTerms``. Every message names the field, the value asked
    for and what the policy allows: public metadata only.
    """
    if terms.privacy_unit not in policy.units:
        _refuse(
            f"privacy_unit {str(terms.privacy_unit)!r} is not offered (allowed: "
            f"{', '.join(policy.units)})"
        )
    if terms.neighbouring != policy.neighbouring:
        _refuse(
            f"neighbouring {str(terms.neighbouring)!r}: exact sizes are disclosed, so every "
            f"release is accounted under {policy.neighbouring!r}"
        )
    if terms.dpda and terms.release not in policy.releases:
        _refuse(f"release {terms.release!r} is not offered (allowed: {', '.join(policy.releases)})")
    if getattr(terms, "preprocessing", "none") != "none":
        lo, hi = policy.preprocessing_share_range
        if not (lo <= terms.preprocessing_share <= hi):
            _refuse(
                f"preprocessing_share {terms.preprocessing_share:g} is outside this source's "
                f"range [{lo:g}, {hi:g}]"
            )
    if terms.batch_size > 0 and not policy.allow_minibatches:
        _refuse("batch_size: this source does not offer minibatch releases")
    if policy.max_session_epsilon is not None and terms.epsilon > policy.max_session_epsilon:
        _refuse(
            f"epsilon {terms.epsilon:g} exceeds this source's per-session maximum "
            f"{policy.max_session_epsilon:g}"
        )
    if terms.pate_queries > 0:
        if not policy.allow_pate:
            _refuse("pate_queries: this source does not answer PATE queries")
        if terms.pate_space == "raw" and not allow_raw_queries:
            _refuse("pate_space 'raw': this source accepts projected queries only")
    if terms.dpda and terms.batch_size > 0 and terms.noise_multiplier > 0:
        # checked before any plan is computed: an accountant run at a tiny σ takes minutes
        floor = policy.min_noise_multiplier
        if terms.noise_multiplier < floor:
            _refuse(f"noise_multiplier {terms.noise_multiplier:g} is below the floor {floor:g}")
        if terms.noise_multiplier * terms.histogram_noise_ratio < floor:
            _refuse(
                f"histogram_noise_ratio: the histogram noise multiplier "
                f"{terms.noise_multiplier * terms.histogram_noise_ratio:.4g} is below the floor "
                f"{floor:g}"
            )
    lo, hi = policy.clip_norm_range
    if terms.privacy_unit == "record" and not (lo <= terms.clip_norm <= hi):
        _refuse(f"clip_norm {terms.clip_norm:g} outside the allowed range [{lo:g}, {hi:g}]")


# cost model of one sinkhorn-synthetic release, in multiply-adds (fitted by timing, see README):
# per step, every row meets every point of its class (cost, softmax, clip: ~ℓ + 32 each), and
# the debiasing plan of each class is up to 200 Sinkhorn iterations over its points
_ROW_POINT_OVERHEAD = 32
_DEBIAS_ITERATIONS = 200


def synthetic_work(terms: Any, n_rows: int, n_classes: int) -> float:
    """Upper bound on the work of one sinkhorn-synthetic release (public terms and sizes)."""
    m = terms.synthetic_points
    per_step = n_rows * m * (terms.projection_dim + _ROW_POINT_OVERHEAD)
    if terms.sinkhorn_debias > 0 and m > 1:
        per_step += n_classes * m * m * (2 * _DEBIAS_ITERATIONS + terms.projection_dim)
    return float(terms.sinkhorn_steps * per_step)


def check_work(policy: PrivacyPolicy, terms: Any, n_rows: int, n_classes: int) -> None:
    """Refuse a release whose work the source's policy does not allow (before any charge)."""
    if terms.dpda and terms.cost == "metric":
        if not policy.allow_metric:
            _refuse("cost: this source does not release a learned metric")
        work = metric_work(
            n_rows, terms.projection_dim, terms.metric_rows, terms.metric_pairs, terms.metric_steps
        )
        if work > policy.max_metric_work:
            _refuse(
                f"metric_steps {terms.metric_steps} × metric_pairs {terms.metric_pairs} at "
                f"projection_dim {terms.projection_dim} is more work than this source allows "
                f"({work:.3g} of {policy.max_metric_work:.3g}): ask for fewer steps or pairs"
            )
        mem = metric_memory(n_rows, terms.projection_dim, terms.metric_rows, terms.metric_pairs)
        if mem > policy.max_metric_bytes:
            _refuse(
                f"metric_pairs {terms.metric_pairs} over this source's {n_rows} rows needs "
                f"{mem / 2**20:.0f} MiB a step, more than it allows "
                f"({policy.max_metric_bytes / 2**20:.0f} MiB): ask for fewer pairs"
            )
    if terms.dpda and terms.release == "sinkhorn-synthetic":
        work = synthetic_work(terms, n_rows, n_classes)
        if work > policy.max_synthetic_work:
            _refuse(
                f"sinkhorn_steps {terms.sinkhorn_steps} × synthetic_points "
                f"{terms.synthetic_points} at projection_dim {terms.projection_dim} is more work "
                f"than this source allows ({work:.3g} of {policy.max_synthetic_work:.3g}): ask "
                "for fewer steps or points"
            )


def check_plan(policy: PrivacyPolicy, plan: Any, terms: Any) -> None:
    """Refuse a plan whose mechanisms would run below the policy's floors.

    ``plan`` is a ``dpda.planner.ReleasePlan``. A floor keeps every sampler where it is exact
    and every noise level above what the source is willing to release at.
    """
    if terms.dpda:
        # T Gaussian steps of σ√T are one Gaussian of σ: the floor applies to what is released
        # in all, not to each step (else more steps would get under it)
        sigma = plan.feature_noise_multiplier / math.sqrt(plan.feature_gradient_steps)
        if sigma < policy.min_noise_multiplier:
            _refuse(
                f"the feature noise multiplier {sigma:.4g} is below the "
                f"floor {policy.min_noise_multiplier:g} (ask for a smaller epsilon)"
            )
        if plan.metric_noise_multiplier is not None:
            m_sigma = plan.metric_noise_multiplier / math.sqrt(plan.metric_steps)
            if m_sigma < policy.min_noise_multiplier:
                _refuse(
                    f"the metric's noise multiplier {m_sigma:.4g} is below the floor "
                    f"{policy.min_noise_multiplier:g} (ask for a smaller epsilon or a larger "
                    "metric_share)"
                )
        if plan.histogram_mechanism == "discrete_laplace":
            if plan.histogram_parameter < policy.min_histogram_parameter:
                _refuse(
                    f"the histogram's discrete-Laplace parameter {plan.histogram_parameter:.4g} "
                    f"is below the floor {policy.min_histogram_parameter:g} (ask for a larger "
                    "epsilon or histogram_share)"
                )
        elif plan.histogram_parameter < policy.min_noise_multiplier:
            _refuse(
                f"the histogram noise multiplier {plan.histogram_parameter:.4g} is below the "
                f"floor {policy.min_noise_multiplier:g}"
            )
    if plan.pate_scale is not None:
        if terms.pate_aggregator == "gnmax" and plan.pate_scale < policy.min_pate_sigma:
            _refuse(
                f"the GNMax σ {plan.pate_scale:.4g} is below the floor {policy.min_pate_sigma:g}"
            )
        if terms.pate_aggregator == "lnmax" and plan.pate_scale > policy.max_pate_gamma:
            _refuse(f"the LNMax γ {plan.pate_scale:.4g} is above the cap {policy.max_pate_gamma:g}")


def reweighting_work(steps: int, rows: int, dim: int) -> float:
    """Multiply-adds of ``steps`` reweighting steps on ``rows`` public rows of ``dim``: per step
    M(q) and the gradient (2·m·d²), the eigendecomposition (≈ 10·d³), and a fixed cost of
    counted as 10⁵ (docs/results.md, "Where the constants come from")."""
    return float(steps) * (2.0 * rows * dim * dim + 10.0 * dim**3 + 1e5)


class TargetPrivacyPolicy(BaseModel):
    """The target's own policy (``[privacy]`` in its config): what it discloses about
    its rows, and in which form. The same shape as a source's: unit, relation, δ, caps. Frozen,
    unknown keys rejected. The default sends no exact statistic and no row of the target."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    units: tuple[Literal["record"], ...] = ("record",)
    neighbouring: Literal["replace-one"] = "replace-one"
    disclosures: Literal["dp", "exact"] = Field(
        default="dp",
        description="dp: the column scaling, the target-pca basis and the clip norm are released "
        "under this policy's ε (dpda.dp.target_disclosure); exact: sent as computed — statistics "
        "of every target row, unprotected (the opt-in gives that up)",
    )
    epsilon: float = Field(default=4.0, gt=0, le=100, description="ε of one job's disclosures")
    epsilon_cap: float = Field(
        default=8.0, gt=0, le=100, description="cap over every job's disclosures of these rows"
    )
    delta: float | None = Field(default=None, gt=0, lt=1, description="default 1/(10·n)")
    row_clip: float | None = Field(
        default=None,
        ge=1e-6,
        le=1e6,
        description="the rows' norm bound in the per-row representation (default 1 for sqrt, "
        "l2 and rownorm; required for raw)",
    )
    row_queries: Literal["synthetic", "dp", "exact"] = Field(
        default="synthetic",
        description="what PATE (method pate or dpda+pate) sends the teachers: synthetic: points "
        "drawn from the DP statistics above (no row, no further ε); dp: target rows drawn at "
        "random, clipped and noised under query_epsilon (dpda.dp.target_disclosure); exact: the "
        "chosen rows, projected, as they are (those rows are not protected at all)",
    )
    query_epsilon: float = Field(
        default=4.0, gt=0, le=100, description="ε of one job's row queries (row_queries = dp)"
    )

    @model_validator(mode="after")
    def _caps(self) -> TargetPrivacyPolicy:
        if self.disclosures == "dp" and self.epsilon > self.epsilon_cap:
            raise ValueError("epsilon: above epsilon_cap")
        if self.row_queries == "dp" and self.disclosures != "dp":
            raise ValueError(
                "row_queries: dp clips the rows at the DP clipping norm; it needs disclosures = dp"
            )
        if self.row_queries == "dp" and self.query_epsilon > self.epsilon_cap:
            raise ValueError("query_epsilon: above epsilon_cap")
        return self
