"""Session terms: everything both parties agree on before a release, and the release plan.

The terms are public metadata (DESIGN.md §2): the dataset name, the privacy unit and relation, the
budget, the projection, the batch rate and every mechanism parameter. ``plan_batches`` turns terms
plus public facts (``ns``, the projection) into the per-batch ``BatchSpec`` — a pure function both
parties can run, so the target can recompute every charge the source makes.

What the attribute unit protects: a change of one feature of one record by at most
``feature_bound`` (in the source's declared scaling). Because Algorithm 2 sends rows sorted by
label, labels are *not* protected under this unit beyond the noisy block boundaries: an adversary
who knows every other record can tell which block the remaining record sits in. The record unit
protects whole records, features and labels.
"""

from __future__ import annotations

import functools
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

from .dp.accounting import (
    LEDGER_PLD_INTERVAL,
    calibrate_sigma,
    discrete_laplace_parameter,
    max_sampled_gaussian_steps,
    sampled_sigma_for_epsilon,
)
from .dp.events import BatchSpec, FeatureSpec, HistogramSpec
from .dp.mechanisms import projection_sensitivity, relation_factor
from .dp.pate import calibrate_pate

LABEL_CAVEAT = (
    "attribute unit: protects feature values (one feature of one record moving by at most "
    "feature_bound); rows are released sorted by label, so labels are protected only at the "
    "level of the noisy class counts, not per record"
)


class SessionTerms(BaseModel):
    """Terms of one session; frozen, unknown fields rejected, every error names its field."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str = Field(min_length=1, max_length=128)
    epsilon: float = Field(gt=0, le=100, description="budget of this session (ε)")
    delta: float = Field(gt=0, lt=1)
    privacy_unit: Literal["attribute", "record"] = "attribute"
    neighbouring: Literal["add-remove", "replace-one"] = "add-remove"
    projection: Literal["jl", "target-pca"] = "target-pca"
    projection_dim: int = Field(default=50, ge=1, le=4096)
    batch_size: int = Field(default=0, ge=0, description="0: one whole-dataset release")
    noise_multiplier: float = Field(
        default=1.1,
        ge=0,
        description="σ/w for minibatches; 0: the smallest σ that spends ε over `steps` batches",
    )
    # σ_h / σ for the per-batch Gaussian histogram. The rows' labels come from the noisy counts
    # (contiguous class blocks), so count noise mislabels rows at every block boundary. With σ
    # calibrated to ε (noise_multiplier = 0, one epoch of batches of 128, ε = 8, 2 seeds), 0.5 gave
    # C→A 51.8 and A→W 43.9; 2 gave 48.3 and 41.4; 0.35 gave 50.3 and 44.2 (the bench uses 0.5).
    # 2 keeps the histogram cheap when σ is fixed.
    histogram_noise_ratio: float = Field(default=2.0, gt=0)
    steps: int = Field(default=0, ge=0, description="minibatch steps; 0: as many as ε allows")
    max_steps: int = Field(default=64, ge=1, le=100_000)
    calibration: Literal["theorem2", "analytic"] = "theorem2"
    histogram_share: float = Field(default=0.5, gt=0, lt=1)
    feature_bound: float = Field(default=1.0, gt=0)
    clip_norm: float = Field(default=1.0, gt=0)
    release: Literal["rows", "prototypes", "class-gaussians"] = Field(
        default="rows",
        description="rows: noisy projected rows (Algorithm 2); prototypes: noisy per-class sums"
        " and counts; class-gaussians: per-class sums, sums of squares and counts",
    )
    # channels: the DPDA feature/histogram releases and PATE teacher votes
    dpda: bool = Field(default=True, description="release noisy features and histograms")
    pate_epsilon: float = Field(default=0.0, ge=0, description="share of ε for PATE answers")
    pate_queries: int = Field(default=0, ge=0, le=100_000)
    pate_teachers: int = Field(default=50, ge=1, le=10_000)
    pate_aggregator: Literal["lnmax", "gnmax"] = "gnmax"
    pate_space: Literal["projected", "raw"] = "projected"

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
        if self.release != "rows" and self.batch_size != 0:
            raise ValueError("batch_size: aggregate releases are whole-dataset releases")
        return self

    @model_validator(mode="after")
    def _calibrated_noise(self) -> SessionTerms:
        if self.noise_multiplier == 0 and (self.batch_size == 0 or self.steps == 0):
            raise ValueError(
                "noise_multiplier: 0 (calibrate to ε) needs minibatches (batch_size > 0) "
                "and a fixed number of steps (steps > 0)"
            )
        return self

    @model_validator(mode="after")
    def _minibatch_relation(self) -> SessionTerms:
        if self.batch_size > 0 and self.neighbouring == "replace-one":
            raise ValueError(
                "batch_size: Poisson minibatches are accounted under add-remove only; "
                "use batch_size = 0 (whole batch) with replace-one"
            )
        return self

    @property
    def caveat(self) -> str:
        if self.privacy_unit == "attribute":
            return LABEL_CAVEAT
        return (
            "record unit: protects whole records (features and label); rows clipped to "
            f"norm {self.clip_norm:.4g} in the projection space"
        )


class ReleasePlan(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    steps: int
    sampling_rate: float | None
    feature_noise_multiplier: float
    feature_sensitivity: float
    histogram_mechanism: str
    histogram_parameter: float
    histogram_sensitivity: int
    pate_scale: float | None = None  # γ (LNMax) or σ (GNMax), calibrated to pate_epsilon
    pate_queries: int = 0

    def spec(self, terms: SessionTerms) -> BatchSpec:
        return BatchSpec(
            FeatureSpec(
                self.feature_noise_multiplier,
                self.feature_sensitivity,
                terms.privacy_unit,
                terms.neighbouring,
            ),
            HistogramSpec(
                self.histogram_mechanism, self.histogram_parameter, self.histogram_sensitivity
            ),
            self.sampling_rate,
        )


@functools.lru_cache(maxsize=256)
def calibrated_minibatch_sigma(
    sampling_rate: float, steps: int, epsilon: float, delta: float, histogram_ratio: float
) -> float:
    """Feature σ/w whose per-batch features + histogram (σ_h = ratio·σ) spend ε over ``steps``
    Poisson batches, under the ledger's own accountant. Public facts only."""
    eff = sampled_sigma_for_epsilon(
        sampling_rate, steps, epsilon, delta, "pld", LEDGER_PLD_INTERVAL
    )
    # the two Gaussians of a batch compose to one of multiplier 1/√(1/σ² + 1/σ_h²)
    return float(eff * np.sqrt(1.0 + 1.0 / histogram_ratio**2)) * (1.0 + 1e-9)


def plan_batches(terms: SessionTerms, n_rows: int, projection: np.ndarray) -> ReleasePlan:
    """The release plan from public facts only (both parties compute the same one)."""
    if n_rows < 1:
        raise ValueError("the dataset is empty")
    pate_scale = None
    if terms.pate_epsilon > 0:
        pate_scale = calibrate_pate(
            terms.pate_aggregator, terms.pate_queries, terms.pate_epsilon, terms.delta
        )
    pate = {"pate_scale": pate_scale, "pate_queries": terms.pate_queries}
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
            **pate,
        )
    eps_dpda = terms.epsilon - terms.pate_epsilon
    sens = projection_sensitivity(
        projection,
        terms.privacy_unit,
        terms.neighbouring,
        feature_bound=terms.feature_bound,
        clip_norm=terms.clip_norm,
    )
    if terms.release == "class-gaussians":
        # [sums / C, sums of squares / C²] per class: one record moves one class block by ≤ √2
        sens = float(np.sqrt(2.0)) * relation_factor(terms.neighbouring)
    if terms.batch_size == 0:
        eps_h = eps_dpda * terms.histogram_share
        eps_f = eps_dpda - eps_h
        return ReleasePlan(
            steps=1,
            sampling_rate=None,
            feature_noise_multiplier=calibrate_sigma(eps_f, terms.delta, terms.calibration),
            feature_sensitivity=sens,
            histogram_mechanism="discrete_laplace",
            histogram_parameter=discrete_laplace_parameter(eps_h, h_sens),
            histogram_sensitivity=h_sens,
            **pate,
        )
    p = min(1.0, terms.batch_size / n_rows)
    sf = terms.noise_multiplier
    if sf == 0:
        sf = calibrated_minibatch_sigma(
            p, terms.steps, eps_dpda, terms.delta, terms.histogram_noise_ratio
        )
    sh = sf * terms.histogram_noise_ratio
    eff = 1.0 / np.sqrt(1.0 / sf**2 + 1.0 / sh**2)
    steps = terms.steps
    allowed = max_sampled_gaussian_steps(eff, p, eps_dpda, terms.delta, "pld", LEDGER_PLD_INTERVAL)
    if steps == 0:
        steps = min(allowed, terms.max_steps)
    if steps < 1 or steps > allowed:
        raise ValueError("steps: the budget does not allow this many minibatches")
    return ReleasePlan(
        steps=steps,
        sampling_rate=p,
        feature_noise_multiplier=sf,
        feature_sensitivity=sens,
        histogram_mechanism="gaussian",
        histogram_parameter=sh,
        histogram_sensitivity=h_sens,
        **pate,
    )
