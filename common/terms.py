"""Session terms: what the target asks for before a release, and the release plan.

The terms are public metadata (DESIGN.md §2): the dataset name, the privacy unit and relation, the
budget, the projection, the batch rate and every mechanism parameter. They only *ask*: the
source's policy (``common.policy``) decides, and the quantities that define the guarantee (the
attribute bound, the relation, the floors) come from the policy, never from the terms.
``plan_batches`` turns terms plus public facts (``ns``, the projection, the target's column
scaling, the policy's attribute bound) into the per-batch ``BatchSpec``: a pure function both
parties run, so the target can recompute every charge the source makes.

Sensitivity is computed on the whole map a source row goes through, in the source's own units:
per-row representation x → (x − mean) / std (the target's scaling) → x·M (the target's basis or
a JL matrix). Under the attribute unit one feature j of one record moves by at most b (the
policy's bound), so the released row moves by at most ``b · max_j ‖M_j‖ / std_j``; under the
record unit each projected row is clipped to norm C, so one replaced record moves its row by at
most 2C.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dpda.dp.accounting import revealed_sampled_epsilon
from dpda.dp.calibration import (
    CalibrationMethod,
    calibrate_sigma,
    discrete_laplace_parameter,
    exact_noise_scale,
    max_revealed_steps,
    revealed_sigma_for_epsilon,
)
from dpda.dp.events import BatchSpec, FeatureSpec, HistogramSpec, MetricSpec, canonical_json
from dpda.dp.events import event_to_json as _event_json
from dpda.dp.mechanisms import (
    MIN_DISCRETE_LAPLACE_PARAMETER,
    Neighbouring,
    PrivacyUnit,
    ReleaseKind,
    attribute_sensitivity,
    class_gaussians_sensitivity,
    projection_sensitivity,
    relation_factor,
)
from dpda.dp.metric import MetricParams, replace_one_sensitivity
from dpda.dp.pate import calibrate_pate
from dpda.dp.sinkhorn_synthetic import GRADIENT_CLIP, SinkhornSyntheticParams

LABEL_CAVEAT = (
    "attribute unit: protects one feature of one record moving by at most the source's "
    "attribute bound; it protects neither labels nor membership (rows are released sorted by "
    "label: knowing a record's own features, its label can be read off the nearest noisy row)"
)


# The share of ε that sets the noisy counts of the whole-dataset aggregate releases (record-unit
# prototypes and class-gaussians, calibrated "exact"): under the joint accounting their counts
# are charged only when the replaced record changes label, where the sums' worst case is
# smaller, so a small share costs the sums almost nothing. One constant, to be tuned.
AGGREGATE_HISTOGRAM_SHARE = 0.1

# Defaults that differ by release (measured: dpda simulate on 6 Office-Caltech pairs and M↔U,
# seed 0, ε = 8: sinkhorn-synthetic 37.7 → 48.8 with these two; see the README).
RELEASE_DEFAULTS: dict[str, dict[str, Any]] = {
    "sinkhorn-synthetic": {"histogram_share": 0.1, "calibration": "analytic"},
    "prototypes": {"histogram_share": AGGREGATE_HISTOGRAM_SHARE, "calibration": "exact"},
    "class-gaussians": {"histogram_share": AGGREGATE_HISTOGRAM_SHARE, "calibration": "exact"},
}
_RELEASE_DEPENDENT = ("release", "histogram_share", "calibration", "projection", "projection_dim")
# ℓ of the target's own OT space for a source-space release: its noise is spread evenly over
# every direction of the source's space, so fewer directions keep less of it (20 against 50:
# +0.9 points on the 12 Office-Caltech pairs at ε = 8, docs/results.md)
SOURCE_SPACE_DIM = 20
# releases computed in the source's own per-row space (``projection = "source"``): sums over the
# source's records, which need no statistic of the target (DESIGN.md §2b)
SOURCE_SPACE_RELEASES = ("prototypes", "class-gaussians")

# a minibatch is one release of up to this many rows (the target's job API bounds it too)
MAX_BATCH_SIZE = 100_000


class SessionTerms(BaseModel):
    """Terms of one session; frozen, unknown fields rejected, every error names its field.

    Defaults follow the default policy: whole records protected (record unit, replace one
    record), one aggregate release (noisy per-class sums and counts).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    dataset: str = Field(min_length=1, max_length=128)
    epsilon: float = Field(gt=0, le=100, description="budget of this session (ε)")
    delta: float = Field(gt=0, lt=1)
    privacy_unit: PrivacyUnit = PrivacyUnit.RECORD
    neighbouring: Neighbouring = Neighbouring.REPLACE_ONE
    projection: Literal["source", "jl", "target-pca"] = Field(
        default="source",
        description="source: the release is computed in the source's own per-row space at full "
        "dimension and the target projects it onto its own basis locally (nothing of the target "
        "is sent); target-pca: the target's basis (and scaling) go to the source; jl: a random "
        "projection the source draws. Default: source for prototypes and class-gaussians, "
        "target-pca for the other releases",
    )
    projection_dim: int = Field(
        default=50,
        ge=1,
        le=4096,
        description="ℓ, the dimension of the OT space; default 50, 20 for source-space releases",
    )
    batch_size: int = Field(
        default=0, ge=0, le=MAX_BATCH_SIZE, description="0: one whole-dataset release"
    )
    # upper bounds: far past any useful noise, and below where the accountant's PLD overflows
    noise_multiplier: float = Field(
        default=1.1,
        ge=0,
        le=1e6,
        description="σ/w for minibatches; 0: the smallest σ that spends ε over `steps` batches",
    )
    # σ_h / σ for the per-batch Gaussian histogram (attribute-unit minibatches: uncharged, since
    # labels do not change under the attribute relation; the noise still blurs block boundaries).
    histogram_noise_ratio: float = Field(default=2.0, gt=0, le=1e6)
    steps: int = Field(
        default=0, ge=0, le=100_000, description="minibatch steps; 0: as many as ε allows"
    )
    max_steps: int = Field(default=64, ge=1, le=100_000)
    calibration: CalibrationMethod = Field(
        default=CalibrationMethod.THEOREM2,
        description="theorem2 (the DPDA paper's formula), analytic (Balle & Wang 2018) or exact "
        "(the smallest σ whose whole-dataset release the ledger charges ≤ ε); default exact for "
        "prototypes and class-gaussians, analytic for sinkhorn-synthetic, theorem2 otherwise",
    )
    histogram_share: float = Field(
        default=0.5,
        gt=0,
        lt=1,
        description="share of ε that sets the noisy counts (whole batch); default 0.1 for "
        "prototypes, class-gaussians and sinkhorn-synthetic, 0.5 otherwise",
    )
    clip_norm: float = Field(default=1.0, gt=0, le=1e12)
    release: ReleaseKind = Field(
        default="prototypes",
        description="rows: noisy projected rows (Algorithm 2); prototypes: noisy per-class sums"
        " and counts; class-gaussians: per-class sums, sums of squares and counts; "
        "sinkhorn-synthetic: labeled synthetic points trained on a DP Sinkhorn loss. Default: "
        "prototypes under the record unit, rows under the attribute unit",
    )
    # sinkhorn-synthetic (dpda.dp.sinkhorn_synthetic); bounded so that one release's work
    # (steps × rows × points × ℓ) stays within seconds at 20k rows
    synthetic_points: int = Field(
        default=10,
        ge=1,
        le=100,
        description="sinkhorn-synthetic: at most this many points per class",
    )
    synthetic_rows_per_point: int = Field(
        default=70,
        ge=1,
        le=1_000_000,
        description="sinkhorn-synthetic: one point per this many (noisy) rows of a class",
    )
    sinkhorn_steps: int = Field(
        default=3, ge=1, le=1000, description="sinkhorn-synthetic: noisy gradient steps T"
    )
    sinkhorn_reg: float = Field(
        default=0.05, ge=1e-3, le=100, description="sinkhorn-synthetic: entropic λ (cost / C²)"
    )
    sinkhorn_debias: float = Field(
        default=0.4, ge=0, le=1, description="sinkhorn-synthetic: debiasing ratio p"
    )
    sinkhorn_learning_rate: float = Field(
        default=0.5, gt=0, le=1, description="sinkhorn-synthetic: step size η"
    )
    # the ground cost (seed 003, ``dpda.dp.metric``): sqeuclidean in the projected space, or a
    # metric W learned under DP from the source's labels and released as one more release of
    # the session. Every knob is bounded so that work and noise stay safe for any peer's values.
    cost: Literal["sqeuclidean", "metric"] = Field(
        default="sqeuclidean",
        description="OT ground cost: sqeuclidean (projected space) or metric (a DP-learned W)",
    )
    metric_share: float = Field(
        default=0.25,
        ge=0.01,
        le=0.99,
        description="metric: its share of the Gaussian releases' privacy loss (μ², i.e. zCDP ρ)",
    )
    metric_dim: int = Field(
        default=0, ge=0, le=4096, description="metric: rows d′ of W (0: projection_dim)"
    )
    metric_pairs: int = Field(
        default=4, ge=1, le=64, description="metric: the public cap m on pairs per record"
    )
    metric_margin: float = Field(
        default=1.0, ge=1e-3, le=10, description="metric: contrastive margin, in units of C"
    )
    metric_clip: float = Field(
        default=0.5, ge=1e-3, le=1e3, description="metric: per-pair gradient clip G (Frobenius)"
    )
    metric_steps: int = Field(default=20, ge=1, le=1000, description="metric: noisy steps T")
    metric_learning_rate: float = Field(
        default=0.5, ge=1e-4, le=100, description="metric: step size η"
    )
    # channels: the DPDA feature/histogram releases and PATE teacher votes
    dpda: bool = Field(default=True, description="release noisy features and histograms")
    pate_epsilon: float = Field(default=0.0, ge=0, description="share of ε for PATE answers")
    pate_queries: int = Field(default=0, ge=0, le=100_000)
    pate_teachers: int = Field(default=50, ge=1, le=10_000)
    pate_aggregator: Literal["lnmax", "gnmax"] = "gnmax"
    pate_space: Literal["projected", "raw"] = "projected"

    @model_validator(mode="before")
    @classmethod
    def _default_release(cls, data: Any) -> Any:
        """Defaults that depend on other terms (``None`` = not given): the release follows the
        unit; sinkhorn-synthetic gives most of ε to the gradients (its counts only size and
        weight the points) and calibrates with the analytic Gaussian; prototypes and
        class-gaussians give a small share to the counts and calibrate exactly, on the joint
        mechanism the ledger charges (RELEASE_DEFAULTS)."""
        if not isinstance(data, dict):
            return data
        data = {k: v for k, v in data.items() if not (k in _RELEASE_DEPENDENT and v is None)}
        if "release" not in data:
            attribute = str(data.get("privacy_unit", PrivacyUnit.RECORD)) == "attribute"
            data["release"] = "rows" if attribute else "prototypes"
        if "projection" not in data:
            release = str(data["release"])
            metric = data.get("cost") == "metric"
            pate = bool(data.get("pate_queries"))
            data["projection"] = (
                "source"
                if release in SOURCE_SPACE_RELEASES and not (metric or pate)
                else "target-pca"
            )
        if "projection_dim" not in data and data["projection"] == "source":
            data["projection_dim"] = SOURCE_SPACE_DIM
        for name, value in RELEASE_DEFAULTS.get(str(data.get("release")), {}).items():
            data.setdefault(name, value)
        return data

    @model_validator(mode="after")
    def _channels(self) -> SessionTerms:
        if (self.pate_epsilon > 0) != (self.pate_queries > 0):
            raise ValueError("pate_queries: PATE needs both pate_epsilon > 0 and pate_queries > 0")
        if self.pate_epsilon > self.epsilon or (self.dpda and self.pate_epsilon >= self.epsilon):
            raise ValueError("pate_epsilon: must leave part of epsilon for the DPDA releases")
        if not self.dpda and self.pate_epsilon == 0:
            raise ValueError("dpda: a session needs at least one release channel")
        return self

    @model_validator(mode="after")
    def _aggregates(self) -> SessionTerms:
        if self.release != "rows" and self.privacy_unit != "record":
            raise ValueError("release: aggregate releases are offered with privacy_unit = record")
        if self.release == "rows" and self.privacy_unit == "record" and self.dpda:
            # Rows are sent sorted by label. Replacing one record by one of another class moves
            # one row across every block boundary in between, so the released vector changes at
            # up to q positions (≈ 2C·√(classes crossed + 1), measured 3.8C at 5 classes), not
            # at one (2C). No bound is charged for that, so the combination is refused.
            raise ValueError(
                "release: per-row releases are offered under the attribute unit only (under the "
                "record unit a label change moves rows across every class block in between); "
                "use prototypes, class-gaussians or sinkhorn-synthetic"
            )
        if self.release != "rows" and self.batch_size != 0:
            raise ValueError("batch_size: aggregate releases are whole-dataset releases")
        if self.projection == "source" and (
            self.release not in SOURCE_SPACE_RELEASES
            or self.cost == "metric"
            or self.pate_queries > 0
        ):
            raise ValueError(
                "projection: 'source' serves the aggregate releases "
                f"{' and '.join(SOURCE_SPACE_RELEASES)} with the sqeuclidean cost and no PATE "
                "queries; use target-pca or jl"
            )
        return self

    @property
    def source_space(self) -> bool:
        """The release is computed in the source's own per-row space (no basis, no scaling)."""
        return self.projection == "source"

    @model_validator(mode="after")
    def _metric(self) -> SessionTerms:
        if self.cost != "metric":
            return self
        if not self.dpda:
            raise ValueError("cost: a metric cost needs the DPDA releases (dpda = true)")
        if self.batch_size != 0:
            raise ValueError(
                "cost: a metric cost is offered with whole-dataset releases only (batch_size = 0)"
            )
        if self.neighbouring != "replace-one":
            raise ValueError("cost: the metric's pair graph is accounted under replace-one")
        if self.metric_dim > self.projection_dim:
            raise ValueError("metric_dim: at most projection_dim")
        return self

    @property
    def metric_rows(self) -> int:
        """d′: the rows of the released W."""
        return self.metric_dim or self.projection_dim

    @model_validator(mode="after")
    def _calibrated_noise(self) -> SessionTerms:
        if self.noise_multiplier == 0 and (self.batch_size == 0 or self.steps == 0):
            raise ValueError(
                "noise_multiplier: 0 (calibrate to ε) needs minibatches (batch_size > 0) "
                "and a fixed number of steps (steps > 0)"
            )
        return self

    @property
    def caveat(self) -> str:
        if self.privacy_unit == "attribute":
            return LABEL_CAVEAT
        return (
            "record unit: protects whole records (features and label) under replace-one; rows "
            f"clipped to norm {self.clip_norm:.4g} in the "
            + ("source's own per-row space" if self.source_space else "projection space")
        )


def terms_error(exc: ValidationError) -> str:
    """``field: rule`` for the first validation error, without the input value (public text)."""
    err = exc.errors()[0]
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        msg = "not a session term (the source's policy, not the terms, sets the unit of privacy)"
    if not err["loc"]:  # a cross-field rule: its message starts with the field it names
        return msg[:300]
    return f"{'.'.join(str(p) for p in err['loc'])}: {msg}"[:300]


def synthetic_params(terms: SessionTerms) -> SinkhornSyntheticParams:
    """The sinkhorn-synthetic knobs of a session (public: both parties read them)."""
    return SinkhornSyntheticParams(
        points_per_class=terms.synthetic_points,
        rows_per_point=terms.synthetic_rows_per_point,
        steps=terms.sinkhorn_steps,
        reg=terms.sinkhorn_reg,
        debias=terms.sinkhorn_debias,
        learning_rate=terms.sinkhorn_learning_rate,
        clip_norm=terms.clip_norm,
    )


def metric_params(terms: SessionTerms) -> MetricParams:
    """The metric knobs of a session (public: both parties read them)."""
    return MetricParams(
        dim=terms.metric_rows,
        pairs_per_record=terms.metric_pairs,
        margin=terms.metric_margin,
        gradient_clip=terms.metric_clip,
        steps=terms.metric_steps,
        learning_rate=terms.metric_learning_rate,
    )


# A metric step's noise std above this is refused at the plan (before any charge): far past any
# useful noise, and it keeps every iterate of W finite (T ≤ 1000, η ≤ 100: |W| ≤ ~1e156).
METRIC_MAX_NOISE_STD = 1e150


class PlanRefused(ValueError):
    """A plan the budget or the terms do not allow; the message is public (terms only)."""


class ReleasePlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int
    sampling_rate: float | None
    feature_noise_multiplier: float
    feature_sensitivity: float
    feature_gradient_steps: int = 1  # sinkhorn-synthetic: T steps of feature_noise_multiplier
    # record-unit prototypes / class-gaussians under replace-one: the sums' L2 sensitivity when
    # the replaced record changes label (the charge is then the joint mechanism); None otherwise
    feature_label_change_sensitivity: float | None = None
    histogram_mechanism: str
    histogram_parameter: float
    histogram_sensitivity: int
    # the source's policy value the feature sensitivity was computed with (attribute unit), so
    # the target can recompute the sensitivity from its own basis and scaling
    attribute_bound: float | None = None
    pate_scale: float | None = None  # γ (LNMax) or σ (GNMax), calibrated to pate_epsilon
    pate_queries: int = 0
    # cost = metric: one more release (index ``steps``), T Gaussian steps of this σ
    metric_noise_multiplier: float | None = None
    metric_sensitivity: float = 0.0
    metric_steps: int = 0

    @property
    def releases(self) -> int:
        """Releases of the session: the feature batches, then the metric if there is one."""
        return self.steps + (1 if self.metric_noise_multiplier is not None else 0)

    def is_metric(self, index: int) -> bool:
        return self.metric_noise_multiplier is not None and index == self.steps

    def metric_spec(self, terms: SessionTerms) -> MetricSpec | None:
        if self.metric_noise_multiplier is None:
            return None
        return MetricSpec(
            self.metric_noise_multiplier,
            self.metric_sensitivity,
            self.metric_steps,
            terms.privacy_unit,
            terms.neighbouring,
        )

    def release_spec(self, terms: SessionTerms, index: int) -> BatchSpec | MetricSpec:
        """The spec of release ``index``: a feature batch, or the metric (the last one)."""
        spec = self.metric_spec(terms) if self.is_metric(index) else None
        return spec if spec is not None else self.spec(terms)

    def events(self, terms: SessionTerms) -> list[Any]:
        """Every event the session's DPDA releases charge (PATE aside)."""
        out = [self.spec(terms).dp_event()] * self.steps
        metric = self.metric_spec(terms)
        return out + ([metric.dp_event()] if metric is not None else [])

    def spec(self, terms: SessionTerms) -> BatchSpec:
        return BatchSpec(
            FeatureSpec(
                self.feature_noise_multiplier,
                self.feature_sensitivity,
                terms.privacy_unit,
                terms.neighbouring,
                self.feature_gradient_steps,
                self.feature_label_change_sensitivity,
            ),
            HistogramSpec(
                self.histogram_mechanism, self.histogram_parameter, self.histogram_sensitivity
            ),
            self.sampling_rate,
        )


@functools.lru_cache(maxsize=256)
def calibrated_minibatch_sigma(
    sampling_rate: float, steps: int, epsilon: float, delta: float
) -> float:
    """Feature σ/w whose ``steps`` attribute-unit Poisson batches spend ε under the ledger's own
    accountant (the revealed-sampling mixture: subsampling amplifies δ, not ε). Public facts."""
    return revealed_sigma_for_epsilon(sampling_rate, steps, epsilon, delta)


def feature_sensitivity(
    terms: SessionTerms,
    projection: np.ndarray,
    attribute_bound: float,
    scaling_std: np.ndarray | None,
) -> float:
    """L2 sensitivity of one released feature vector, on the whole map, in source units."""
    if terms.release == "sinkhorn-synthetic":
        # the stacked per-record gradient vectors, each clipped to GRADIENT_CLIP: one record
        # moves the sum by ≤ 2·clip (replace-one) or ≤ clip (add/remove), at every step
        return float(relation_factor(terms.neighbouring) * GRADIENT_CLIP)
    if terms.release == "class-gaussians":
        # [sums / C, sums of squares / C²] per class: replace-one, same class 3/√2 (proved in
        # class_gaussians_sensitivity); add/remove √2. A label change: label_change_sensitivity.
        return class_gaussians_sensitivity(terms.neighbouring)
    if terms.privacy_unit == "attribute":
        std = np.ones(projection.shape[0]) if scaling_std is None else scaling_std
        return attribute_sensitivity(projection, std, attribute_bound)
    return projection_sensitivity(
        projection, terms.privacy_unit, terms.neighbouring, clip_norm=terms.clip_norm
    )


def label_change_sensitivity(terms: SessionTerms, same_label: float) -> float | None:
    """L2 sensitivity of the per-class sums when the replaced record changes label, for the
    releases whose charge is the joint mechanism (``events.LabelBranchDpEvent``): record-unit,
    whole-dataset prototypes and class-gaussians under replace-one; None for every other.

    ``same_label`` is ``feature_sensitivity`` (the same-label case, which sets the noise).
    Prototypes: rows clipped to C, so the same label moves one class sum by ≤ 2C and a label
    change moves two class sums by ≤ C each, √2·C together: ``same_label / √2``.
    Class-gaussians: two blocks of norm ≤ √2 each, 2 together (``class_gaussians_sensitivity``).
    """
    if (
        terms.privacy_unit != "record"
        or terms.neighbouring != "replace-one"
        or terms.batch_size != 0
    ):
        return None
    if terms.release == "prototypes":
        return same_label / float(np.sqrt(2.0))
    if terms.release == "class-gaussians":
        return class_gaussians_sensitivity(terms.neighbouring, label_change=True)
    return None


def _whole_dataset_plan(
    terms: SessionTerms,
    sigma: float,
    *,
    sens: float,
    cross: float | None,
    a: float,
    h_sens: int,
    common: dict[str, Any],
) -> ReleasePlan:
    """The whole-dataset plan whose Gaussian parts together are one Gaussian of multiplier
    ``sigma`` (features alone; with a metric, features and metric; sinkhorn-synthetic, its T
    steps), with counts DLap(``a``)."""
    metric: dict[str, Any] = {}
    if terms.cost == "metric":
        # The features' Gaussian and the metric's T steps compose to one Gaussian of
        # μ² = 1/σ_f² + T/σ_m²; giving the metric the share s of μ² = 1/σ² keeps the whole
        # Gaussian part exactly the Gaussian of multiplier σ, so the session spends what it
        # spends without the metric.
        s = terms.metric_share
        t_m = terms.metric_steps
        metric = {
            "metric_noise_multiplier": sigma
            / float(np.sqrt(s))
            * float(np.sqrt(t_m))
            * (1 + 1e-12),
            "metric_sensitivity": replace_one_sensitivity(terms.metric_pairs, terms.metric_clip),
            "metric_steps": t_m,
        }
        sigma = sigma / float(np.sqrt(1.0 - s)) * (1 + 1e-12)
    gradient_steps = 1
    if terms.release == "sinkhorn-synthetic":
        # T Gaussian steps of multiplier σ√T compose to exactly one Gaussian of σ
        gradient_steps = terms.sinkhorn_steps
        sigma *= float(np.sqrt(gradient_steps)) * (1 + 1e-12)  # rounded toward more noise
    return ReleasePlan(
        steps=1,
        sampling_rate=None,
        feature_noise_multiplier=sigma,
        feature_gradient_steps=gradient_steps,
        feature_sensitivity=sens,
        feature_label_change_sensitivity=cross,
        histogram_mechanism="discrete_laplace",
        histogram_parameter=a,
        histogram_sensitivity=h_sens,
        **common,
        **metric,
    )


def _exact_sigma(terms: SessionTerms, whole: Any, eps_dpda: float) -> float:
    """Calibration "exact": the smallest σ (rounded toward more noise) whose whole-dataset
    release — every event the plan charges, the joint mechanism of sums and counts, the metric
    if any — the ledger's own accountant charges ≤ ε at δ (``accounting.exact_noise_scale``).
    The counts' parameter stays the one ``histogram_share`` sets. The search is named by the
    plan's events at σ = 1 (every Gaussian multiplier of the plan is proportional to σ)."""

    def events(sigma: float) -> list[Any]:
        return list(whole(sigma).events(terms))

    key = tuple(canonical_json(_event_json(e)) for e in events(1.0))
    try:
        return exact_noise_scale(events, eps_dpda, terms.delta, key=key)
    except ValueError:
        raise PlanRefused("epsilon: no noise level spends as little as this budget") from None


def plan_batches(
    terms: SessionTerms,
    n_rows: int,
    projection: np.ndarray,
    *,
    attribute_bound: float = 1.0,
    scaling_std: np.ndarray | None = None,
) -> ReleasePlan:
    """The release plan from public facts only (both parties compute the same one).

    Under the attribute relation the record and its label are in both neighbours, so the label
    histogram does not change and is not charged; its noise still blurs the block boundaries.
    """
    if n_rows < 1:
        raise PlanRefused("the dataset is empty")
    pate_scale = None
    if terms.pate_epsilon > 0:
        pate_scale = calibrate_pate(
            terms.pate_aggregator, terms.pate_queries, terms.pate_epsilon, terms.delta
        )
    attribute = terms.privacy_unit == "attribute"
    if terms.dpda and terms.release == "rows" and not attribute:
        # the SessionTerms validator says so too; terms built without validation end here
        raise PlanRefused("release: per-row releases are offered under the attribute unit only")
    common: dict[str, Any] = {
        "pate_scale": pate_scale,
        "pate_queries": terms.pate_queries,
        "attribute_bound": attribute_bound if attribute else None,
    }
    h_sens = relation_factor(terms.neighbouring)
    if not terms.dpda:
        return ReleasePlan(
            steps=0,
            sampling_rate=None,
            feature_noise_multiplier=0.0,
            feature_sensitivity=0.0,
            histogram_mechanism="discrete_laplace",
            histogram_parameter=0.0,
            histogram_sensitivity=h_sens,
            **common,
        )
    eps_dpda = terms.epsilon - terms.pate_epsilon
    sens = feature_sensitivity(terms, projection, attribute_bound, scaling_std)
    if not (np.isfinite(sens) and sens > 0):
        raise PlanRefused("the feature sensitivity is not a finite positive number")
    if terms.batch_size == 0:
        eps_h = eps_dpda * terms.histogram_share
        a = discrete_laplace_parameter(eps_h, h_sens)
        whole = functools.partial(
            _whole_dataset_plan,
            terms,
            sens=sens,
            cross=label_change_sensitivity(terms, sens),
            a=a,
            h_sens=h_sens,
            common=common,
        )
        if CalibrationMethod(terms.calibration) is CalibrationMethod.EXACT:
            if a < MIN_DISCRETE_LAPLACE_PARAMETER:
                # no count sampler runs there (exact or refused): said before a search that
                # such a budget may not allow at all, in the words of the policy's floor
                raise PlanRefused(
                    f"the histogram's discrete-Laplace parameter {a:.4g} is below the floor "
                    f"{MIN_DISCRETE_LAPLACE_PARAMETER:g} (ask for a larger epsilon or "
                    "histogram_share)"
                )
            sigma = _exact_sigma(terms, whole, eps_dpda)
        else:
            eps_f = eps_dpda if attribute else eps_dpda - eps_h
            sigma = calibrate_sigma(eps_f, terms.delta, terms.calibration)
        plan = whole(sigma)
        if plan.metric_noise_multiplier is not None and not (
            plan.metric_noise_multiplier * plan.metric_sensitivity <= METRIC_MAX_NOISE_STD
        ):  # NaN and ∞ too
            raise PlanRefused(
                "epsilon: the metric's noise at this budget is past any useful level "
                "(ask for a larger epsilon or metric_share)"
            )
        return plan
    if terms.cost == "metric":  # SessionTerms refuses this; plans are public, so say it again
        raise PlanRefused("cost: a metric cost is offered with whole-dataset releases only")
    if not attribute:  # SessionTerms refuses this; plans are public, so say it again here
        raise PlanRefused("per-row minibatches are offered under the attribute unit only")
    p = min(1.0, terms.batch_size / n_rows)
    sf = terms.noise_multiplier
    if sf == 0:
        sf = calibrated_minibatch_sigma(p, terms.steps, eps_dpda, terms.delta)
    if terms.steps:
        steps = terms.steps
        if revealed_sampled_epsilon(sf, p, steps, terms.delta) > eps_dpda:
            raise PlanRefused("steps: the budget does not allow this many minibatches")
    elif revealed_sampled_epsilon(sf, p, terms.max_steps, terms.delta) <= eps_dpda:
        steps = terms.max_steps
    else:
        steps = max_revealed_steps(sf, p, eps_dpda, terms.delta)
        if steps < 1:
            raise PlanRefused("steps: the budget does not allow a single minibatch at this σ")
    return ReleasePlan(
        steps=steps,
        sampling_rate=p,
        feature_noise_multiplier=sf,
        feature_sensitivity=sens,
        histogram_mechanism="gaussian",
        histogram_parameter=sf * terms.histogram_noise_ratio,
        histogram_sensitivity=h_sens,
        **common,
    )


METHODS = ("dpda", "pate", "dpda+pate")
PATE_SHARE = 0.1  # dpda+pate: the share of ε given to PATE answers (config, CLI and simulate)


def method_terms(
    terms: SessionTerms, method: str, pate_queries: int, pate_share: float
) -> SessionTerms:
    """The session terms of one method at the same total ε."""
    if method == "dpda":
        return terms.model_copy(update={"pate_epsilon": 0.0, "pate_queries": 0, "dpda": True})
    if method != "dpda" and terms.source_space:  # PATE's queries live in a shared space
        terms = terms.model_copy(update={"projection": "target-pca"})
    if method == "pate":
        return SessionTerms.model_validate(
            {
                **terms.model_dump(),
                "dpda": False,
                "pate_epsilon": terms.epsilon,
                "pate_queries": pate_queries,
            }
        )
    if method == "dpda+pate":
        return SessionTerms.model_validate(
            {
                **terms.model_dump(),
                "dpda": True,
                "pate_epsilon": terms.epsilon * pate_share,
                "pate_queries": pate_queries,
            }
        )
    raise ValueError(f"unknown method {method!r} (choose from {', '.join(METHODS)}, all)")


# ------------------------------------------------------------------ the reverse setting (seed 001)
class ReweightingTerms(BaseModel):
    """Terms of a reweighting session (the reverse deployment): the party with public labeled
    rows asks the data holder — the serving daemon, whose rows are private — for the DP steps of
    a private discrepancy minimisation (``dpda.dp.discrepancy``). Public; the holder's policy and
    ledger decide, and the guarantee reads nothing here but ε, δ and the step count (Δ∞ comes
    from the holder's own clip and row count and from the rows it actually received)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    dataset: str = Field(min_length=1, max_length=128)
    method: Literal["noisy-fw", "noisy-md", "single-stage"] = "noisy-fw"
    epsilon: float = Field(gt=0, le=100, description="budget of this session (ε)")
    delta: float = Field(gt=0, lt=1)
    steps: int = Field(default=1000, ge=1, le=100_000, description="optimisation steps")
    smoothing: float = Field(
        default=20.0, ge=0.01, le=1e4, description="μ of the smooth discrepancy F̃"
    )
    ridge: float = Field(default=1e-3, ge=0, le=1e3, description="λ on ‖q‖²")
    learning_rate: float = Field(default=0.5, gt=0, le=100, description="noisy-md: η")
    predictor_radius: float = Field(default=2.0, gt=0, le=1e3, description="single-stage: Λ")
    representation: Literal["raw", "sqrt", "rownorm", "l2"] = "raw"


class ReweightingPlan(BaseModel):
    """What each step costs, from public terms only: ε₀ of one exponential-mechanism step
    (Frank–Wolfe methods) or σ of one Gaussian step (mirror descent). Both parties compute it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    steps: int
    step_parameter: float

    def event(self, count: int) -> Any:
        from dpda.dp.discrepancy import step_event

        return step_event(self.method, self.step_parameter, count)


@functools.lru_cache(maxsize=64)
def plan_reweighting(terms: ReweightingTerms) -> ReweightingPlan:
    """The per-step parameter whose ``steps`` steps spend at most ε at δ under the ledger's
    accounting (``ledger.spend_of``: the smaller of PLD and RDP for exponential-mechanism steps)."""
    from dpda.dp.discrepancy import step_parameter
    from dpda.dp.ledger import spend_of

    p = step_parameter(terms.method, terms.epsilon, terms.delta, terms.steps)
    plan = ReweightingPlan(method=terms.method, steps=terms.steps, step_parameter=p)
    if spend_of([plan.event(terms.steps)], terms.delta) > terms.epsilon * (1 + 1e-9):
        raise PlanRefused(
            f"steps: {terms.steps} steps cannot spend as little as ε {terms.epsilon:g} "
            "(the noise search ends at its bound)"
        )
    return plan


def reweighter(terms: ReweightingTerms, rows: np.ndarray, labels: np.ndarray | None) -> Any:
    """The session's optimiser over the public ``rows`` (``discrepancy.Reweighter``): the one
    state both parties advance, built the same way on both sides."""
    from dpda.dp.discrepancy import Reweighter

    return Reweighter(
        rows,
        terms.method,
        mu=terms.smoothing,
        ridge=terms.ridge,
        y=labels,
        learning_rate=terms.learning_rate,
        predictor_radius=terms.predictor_radius,
    )
