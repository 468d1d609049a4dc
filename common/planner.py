"""The release plan: ``plan_batches`` turns session terms plus public facts (``ns``, the
projection, the target's column scaling, the policy's attribute bound) into the per-batch
``BatchSpec``: a pure function both parties run, so the target can recompute every charge the
source makes.

Sensitivity is computed on the whole map a source row goes through, in the source's own units:
per-row representation x → (x − mean) / std (the target's scaling) → x·M (the target's basis or
a JL matrix). Under the attribute unit one feature j of one record moves by at most b (the
policy's bound), so the released row moves by at most ``b · max_j ‖M_j‖ / std_j``; under the
record unit each projected row is clipped to norm C, so one replaced record moves its row by at
most 2C.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict

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
    attribute_sensitivity,
    class_gaussians_sensitivity,
    projection_sensitivity,
    relation_factor,
)
from dpda.dp.metric import replace_one_sensitivity
from dpda.dp.pate import calibrate_pate
from dpda.dp.preprocessing_dp import PreprocessingSpec, preprocessing_spec
from dpda.dp.sinkhorn_synthetic import GRADIENT_CLIP
from dpda.terms import SessionTerms

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
    # preprocessing = standardize: the one Gaussian its two histograms compose to, and the
    # number of columns it counts (``dpda.dp.preprocessing_dp``); charged once per session
    preprocessing_noise_multiplier: float | None = None
    preprocessing_columns: int = 0

    def preprocessing_spec(self, terms: SessionTerms) -> PreprocessingSpec | None:
        """The session's preprocessing mechanism, or None."""
        if self.preprocessing_noise_multiplier is None:
            return None
        return preprocessing_spec(
            self.preprocessing_noise_multiplier,
            self.preprocessing_columns,
            terms.neighbouring,
            terms.preprocessing_share,
        )

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

    def charged_events(self, terms: SessionTerms, index: int) -> list[Any]:
        """The events release ``index``'s ledger entry charges: its own, and for the first
        release of a session with preprocessing the preprocessing's before it (one entry, one
        composed event, signed, countersigned and synced as every release's is)."""
        own = [self.release_spec(terms, index).dp_event()]
        pre = self.preprocessing_spec(terms)
        return own if pre is None or index != 0 else [pre.dp_event(), *own]

    def charged_event(self, terms: SessionTerms, index: int) -> Any:
        """``charged_events`` as the one event the entry records (``PrivacyLedger.append``)."""
        from dp_accounting import dp_event

        evs = self.charged_events(terms, index)
        return evs[0] if len(evs) == 1 else dp_event.ComposedDpEvent(list(evs))

    def events(self, terms: SessionTerms) -> list[Any]:
        """Every event the session's DPDA releases charge (PATE aside), the preprocessing
        first."""
        pre = self.preprocessing_spec(terms)
        out = [] if pre is None else [pre.dp_event()]
        out += [self.spec(terms).dp_event()] * self.steps
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
        return class_gaussians_sensitivity(terms.neighbouring, nonnegative=terms.nonnegative_rows)
    if terms.privacy_unit == "attribute":
        std = np.ones(projection.shape[0]) if scaling_std is None else scaling_std
        return attribute_sensitivity(projection, std, attribute_bound)
    return projection_sensitivity(
        projection,
        terms.privacy_unit,
        terms.neighbouring,
        clip_norm=terms.clip_norm,
        nonnegative=terms.nonnegative_rows,
    )


def label_change_sensitivity(terms: SessionTerms, same_label: float) -> float | None:
    """L2 sensitivity of the per-class sums when the replaced record changes label, for the
    releases whose charge is the joint mechanism (``events.LabelBranchDpEvent``): record-unit,
    whole-dataset prototypes and class-gaussians under replace-one; None for every other.

    ``same_label`` is ``feature_sensitivity`` (the same-label case, which sets the noise).
    Prototypes: rows clipped to C, so the same label moves one class sum by ≤ 2C (√2·C with
    enforced non-negative rows) and a label change moves two class sums by ≤ C each, √2·C
    together, whether or not the rows are non-negative.
    Class-gaussians: two blocks of norm ≤ √2 each, 2 together (``class_gaussians_sensitivity``).
    """
    if (
        terms.privacy_unit != "record"
        or terms.neighbouring != "replace-one"
        or terms.batch_size != 0
    ):
        return None
    if terms.release == "prototypes":
        # same_label is 2C, or √2·C itself with enforced non-negative rows
        return same_label if terms.nonnegative_rows else same_label / float(np.sqrt(2.0))
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
    if terms.preprocessing != "none":
        if not (terms.source_space and terms.batch_size == 0):
            raise PlanRefused("preprocessing: offered with whole-dataset source-space releases")
        # its Gaussian alone spends the share; the release is then calibrated on both together
        # (exact), so the session spends ε, not ε(1 − share) plus a loose remainder
        common["preprocessing_noise_multiplier"] = calibrate_sigma(
            terms.preprocessing_share * eps_dpda, terms.delta, CalibrationMethod.ANALYTIC
        )
        common["preprocessing_columns"] = int(projection.shape[0])
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
