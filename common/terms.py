"""Session terms: what the target asks for before a release.

The terms are public metadata (docs/privacy-model.md): the dataset name, the privacy unit and
relation, the budget, the projection, the batch rate and every mechanism parameter. They only *ask*:
the source's policy (``dpda.policy``) decides, and the quantities that define the guarantee (the
attribute bound, the relation, the floors) come from the policy, never from the terms.
``dpda.planner.plan_batches`` turns terms plus public facts into the release plan; the public-source
setting's terms are ``dpda.public_source_terms``.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from dpda.dp.calibration import (
    CalibrationMethod,
)
from dpda.dp.mechanisms import (
    Neighbouring,
    PrivacyUnit,
    ReleaseKind,
)
from dpda.dp.metric import MetricParams
from dpda.dp.sinkhorn_synthetic import SinkhornSyntheticParams

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

# Defaults that differ by release (chosen with dpda simulate on Office-Caltech and the digits:
# docs/results.md, "DP synthetic points through a Sinkhorn loss").
RELEASE_DEFAULTS: dict[str, dict[str, Any]] = {
    "sinkhorn-synthetic": {"histogram_share": 0.1, "calibration": "analytic"},
    "prototypes": {"histogram_share": AGGREGATE_HISTOGRAM_SHARE, "calibration": "exact"},
    "class-gaussians": {"histogram_share": AGGREGATE_HISTOGRAM_SHARE, "calibration": "exact"},
}
RELEASE_DEPENDENT = (
    "release", "histogram_share", "calibration", "projection", "projection_dim", "cells",
)  # fmt: skip
# ℓ of the target's own OT space for a source-space release: its noise is spread evenly over
# every direction of the source's space, so fewer directions keep less of it (20 against 50:
# +0.9 points on the 12 Office-Caltech pairs at ε = 8, docs/results.md)
SOURCE_SPACE_DIM = 20
# releases computed in the source's own per-row space (``projection = "source"``): sums over the
# source's records, which need no statistic of the target (docs/privacy-model.md, "The target
# owns its privacy too")
SOURCE_SPACE_RELEASES = ("prototypes", "class-gaussians")

# the share of a session's ε a source-space release on raw rows gives to the source's DP
# column standardization and row bound (``dpda.dp.preprocessing_dp``)
PREPROCESSING_SHARE = 0.1

# prototypes: the most cells per class a session may ask for (the release is q × cells points)
MAX_CELLS = 16
# prototypes on raw rows the source standardizes, when the job leaves cells out: the most cells
# per class the target asks for, and how noisy a cell's mean may be. A (class, cell) mean's
# noise has norm ≈ σ·√k·q·K / n (rows in the unit ball); the target asks for the largest
# K ≤ AUTO_CELLS that keeps it ≤ AUTO_CELL_NOISE. Chosen on the development suite at ε 8 and 2
# (docs/results.md#cells); with them the vote on standardized rows takes the wider gate of
# ``choice.STANDARDIZED_VOTE``: at the narrower one, the shipped example's job (whose target
# mixes its classes otherwise than the source) lost its correct labellings in some draws
AUTO_CELLS = 3
AUTO_CELL_NOISE = 0.2
# a received (class, cell) mean is a point of its own when its noise, σ·√k / n̂, is at most
# this (``fitting.cell_points``); a class's other cells are pooled into one mean
CELL_NOISE_SHARE = 0.5

# a minibatch is one release of up to this many rows (the target's job API bounds it too)
MAX_BATCH_SIZE = 100_000
# the ε a rehearsal (``dpda simulate``, ``DPDAClassifier``) asks for when none is given; the
# terms themselves have no default ε: a session always states its own
DEFAULT_EPSILON = 8.0


class SessionTerms(BaseModel):
    """Terms of one session; frozen, unknown fields rejected, every error names its field.

    Defaults follow the default policy: whole records protected (record unit, replace one
    record), one aggregate release (noisy per-class sums and counts).

    A default given as None below is filled in from the unit and the release when the field
    is left out (or given as None); ``term_default`` gives every other field's default.

    Attributes
    ----------
    dataset : str
        The source's dataset the session reads, 1 to 128 characters. Required.
    epsilon : float
        ε, the session's budget, in (0, 100]. Required.
    delta : float
        δ, in (0, 1). Required.
    privacy_unit : {'record', 'attribute'}, default 'record'
        What the releases protect: ``record``, a whole record (features and label);
        ``attribute``, one feature of one record moving by at most the source's attribute
        bound, and neither labels nor membership. The aggregate releases take ``record``.
    neighbouring : {'replace-one', 'add-remove'}, default 'replace-one'
        The neighbouring relation the terms ask for. A source accounts every release under
        ``replace-one`` (it discloses exact sizes) and refuses ``add-remove``.
    projection : {'source', 'target-pca', 'jl'}, default None
        The space the release is computed in: ``source``, the source's own per-row space at
        full dimension, which the target projects onto its own basis (nothing of the target
        is sent; ``prototypes`` and ``class-gaussians`` with the ``sqeuclidean`` cost and no
        PATE queries only);
        ``target-pca``, the target's basis (and scaling), sent to the source; ``jl``, a random
        projection the source draws. None: ``source`` for ``prototypes`` and
        ``class-gaussians`` where it is offered, ``target-pca`` otherwise.
    projection_dim : int, default None
        ℓ, the dimension of the OT space, in [1, 4096]. None: 20 with
        ``projection='source'``, 50 otherwise.
    batch_size : int, default 0
        Rows per minibatch release, in [0, 100000]; 0: one whole-dataset release. Aggregate
        releases take 0.
    noise_multiplier : float, default 1.1
        σ/w, the minibatches' Gaussian noise per unit of sensitivity, in [0, 1e6]; 0: the
        smallest σ that spends ε over ``steps`` batches (it takes ``batch_size > 0`` and
        ``steps > 0``).
    histogram_noise_ratio : float, default 2.0
        σ_h/σ, the noise of each minibatch's Gaussian class histogram relative to that of its
        rows, in (0, 1e6].
    steps : int, default 0
        Minibatch releases, in [0, 100000]; 0: as many as ε allows, at most ``max_steps``.
    max_steps : int, default 64
        The most minibatch releases with ``steps=0``, in [1, 100000].
    calibration : {'theorem2', 'analytic', 'exact'}, default None
        How σ follows from ε: ``theorem2`` (the DPDA paper's formula), ``analytic`` (Balle &
        Wang 2018) or ``exact`` (the smallest σ whose whole-dataset release the ledger charges
        at most ε). None: ``exact`` for ``prototypes`` and ``class-gaussians``, ``analytic``
        for ``sinkhorn-synthetic``, ``theorem2`` otherwise.
    histogram_share : float, default None
        The share of ε that sets the noisy counts (whole batch), in (0, 1). None: 0.1 for
        ``prototypes``, ``class-gaussians`` and ``sinkhorn-synthetic``, 0.5 otherwise.
    clip_norm : float, default 1.0
        C, the L2 norm each released row is clipped to, in (0, 1e12]; the source's policy
        bounds it further under the record unit.
    nonnegative_rows : bool, default False
        Source-space aggregates: the source maps every row to max(x, 0) after its per-row
        representation and before clipping (a no-op for ``sqrt`` rows), so a same-label
        replacement moves a class sum by at most √2·C instead of 2C and the release needs
        less noise. Not with ``preprocessing='standardize'``; ``projection='source'`` only.
    cells : int, default None
        Prototypes: the source sums each class's rows in this many cells (a row's cell is the
        nearest of as many random directions, drawn independently of the data) and releases one
        noisy sum and count per (class, cell), in [1, 16]. One record still moves one row, so
        the charge is the per-class release's; a class made of several clusters keeps several
        points, each with the noise of its own count (``dpda.dp.mechanisms.row_cells``).
        None: a source-space job on raw rows the source standardizes asks for the largest
        K ≤ ``AUTO_CELLS`` whose cell means keep noise ≤ ``AUTO_CELL_NOISE`` at the source's
        rows per class (``dpda.target_party.view.auto_cells``), 1 otherwise.
    preprocessing : {'none', 'standardize'}, default 'none'
        Source-space releases: ``standardize``, the source learns each column's location and
        scale and the row bound C from its own rows under DP (one more ledger entry, from
        ``preprocessing_share`` of ε) and releases its rows standardized, clipped to C and
        divided by it; the target standardizes its own rows with its own exact statistics of
        the same kind. It takes ``projection='source'`` and ``calibration='exact'``. A
        source-space job that leaves it out runs ``standardize`` for raw rows with
        ``calibration='exact'`` and ``none`` otherwise.
    preprocessing_share : float, default 0.1
        ``standardize``: the share of ε its statistics are planned from, in (0, 1); the
        source's policy bounds it further.
    release : {'prototypes', 'class-gaussians', 'sinkhorn-synthetic', 'rows'}, default None
        ``prototypes``: noisy per-class sums and counts; ``class-gaussians``: per-class sums,
        sums of squares and counts; ``sinkhorn-synthetic``: labeled synthetic points trained
        on a DP Sinkhorn loss; ``rows``: noisy projected rows (Algorithm 2), under the
        attribute unit. None: ``prototypes`` under the record unit, ``rows`` under the
        attribute unit.
    synthetic_points : int, default 10
        ``sinkhorn-synthetic``: at most this many points per class, in [1, 100].
    synthetic_rows_per_point : int, default 70
        ``sinkhorn-synthetic``: one point per this many (noisy) rows of a class, in
        [1, 1000000].
    sinkhorn_steps : int, default 3
        ``sinkhorn-synthetic``: the noisy gradient steps T, in [1, 1000].
    sinkhorn_reg : float, default 0.05
        ``sinkhorn-synthetic``: the entropic λ, in units of cost/C², in [0.001, 100].
    sinkhorn_debias : float, default 0.4
        ``sinkhorn-synthetic``: the debiasing ratio p, in [0, 1].
    sinkhorn_learning_rate : float, default 0.5
        ``sinkhorn-synthetic``: the step size η, in (0, 1].
    cost : {'sqeuclidean', 'metric'}, default 'sqeuclidean'
        The OT ground cost: ``sqeuclidean`` in the projected space, or ``metric``, a metric W
        learned under DP from the source's labels and released as one more release of the
        session (it takes ``dpda``, ``batch_size=0`` and ``replace-one``).
    metric_share : float, default 0.25
        ``metric``: its share of the Gaussian releases' privacy loss (μ², i.e. zCDP ρ), in
        [0.01, 0.99].
    metric_dim : int, default 0
        ``metric``: the rows d′ of W, in [0, 4096] and at most ``projection_dim``; 0:
        ``projection_dim`` (``metric_rows``).
    metric_pairs : int, default 4
        ``metric``: the public cap m on pairs per record, in [1, 64].
    metric_margin : float, default 1.0
        ``metric``: the contrastive margin, in units of C, in [0.001, 10].
    metric_clip : float, default 0.5
        ``metric``: the per-pair gradient clip G (Frobenius norm), in [0.001, 1000].
    metric_steps : int, default 20
        ``metric``: the noisy steps T, in [1, 1000].
    metric_learning_rate : float, default 0.5
        ``metric``: the step size η, in [0.0001, 100].
    dpda : bool, default True
        The DPDA channel: the noisy feature and histogram releases. A session has this
        channel, PATE, or both.
    pate_epsilon : float, default 0.0
        The part of ``epsilon`` PATE answers spend, at least 0; positive exactly when
        ``pate_queries`` is, and below ``epsilon`` with the DPDA channel (at most ``epsilon``
        without it).
    pate_queries : int, default 0
        PATE: the target rows the teachers label, in [0, 100000]; 0: no PATE.
    pate_teachers : int, default 50
        PATE: the teachers the source trains, each on its own disjoint part of its records, in
        [1, 10000].
    pate_aggregator : {'gnmax', 'lnmax'}, default 'gnmax'
        PATE: the noisy arg-max of the teachers' votes, with Gaussian (``gnmax``) or Laplace
        (``lnmax``) noise.
    pate_space : {'projected', 'raw'}, default 'projected'
        PATE: the space the queries are sent in, the session's projection or the target's
        rows as they are (an opt-in of the source).
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
    nonnegative_rows: bool = Field(
        default=False,
        description="source-space aggregates: the source maps every row to max(x, 0) after its "
        "per-row representation and before clipping (a no-op for sqrt rows), so a same-label "
        "replacement moves a class sum by at most √2·C instead of 2C and the release needs less "
        "noise",
    )
    preprocessing: Literal["none", "standardize"] = Field(
        default="none",
        description="source-space releases: standardize, the source learns each column's "
        "location and scale and the row bound C from its own rows under DP (one more ledger "
        "entry, from preprocessing_share of ε) and releases its rows standardized, clipped to "
        "C and divided by it; the target standardizes its own rows with its own exact "
        "statistics of the same kind. Default: standardize for raw rows, none otherwise",
    )
    preprocessing_share: float = Field(
        default=PREPROCESSING_SHARE,
        gt=0,
        lt=1,
        description="standardize: the share of ε its statistics are planned from (the source's "
        "policy bounds it)",
    )
    cells: int = Field(
        default=1,
        ge=1,
        le=MAX_CELLS,
        description="prototypes: the source sums each class's rows in this many cells, a row's "
        "cell the nearest of as many random directions drawn independently of the data, and "
        "releases one noisy sum and count per (class, cell): a class made of several clusters "
        "keeps several points at the same ε (one record still moves one row: the sensitivity "
        "is the per-class release's), each with the noise of its own count; 1: one point "
        "per class. Default: for raw rows the source standardizes, the most cells (at most 3) "
        "whose means the release's noise leaves precise enough, from the source's rows per "
        "class; 1 otherwise",
    )
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
    # the ground cost (``dpda.dp.metric``): sqeuclidean in the projected space, or a
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
        data = {k: v for k, v in data.items() if not (k in RELEASE_DEPENDENT and v is None)}
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
            # up to q positions (≈ 2C·√(classes crossed + 1)), not at one (2C). No bound is
            # charged for that, so the combination is refused.
            raise ValueError(
                "release: per-row releases are offered under the attribute unit only (under the "
                "record unit a label change moves rows across every class block in between); "
                "use prototypes, class-gaussians or sinkhorn-synthetic"
            )
        if self.release != "rows" and self.batch_size != 0:
            raise ValueError("batch_size: aggregate releases are whole-dataset releases")
        if self.preprocessing != "none" and self.projection != "source":
            raise ValueError(
                "preprocessing: offered with projection = 'source' only (the release is "
                "computed in the source's own space)"
            )
        if self.preprocessing != "none" and self.calibration != "exact":
            raise ValueError(
                "preprocessing: the release is calibrated together with it (calibration = 'exact')"
            )
        if self.cells > 1 and self.release != "prototypes":
            raise ValueError("cells: offered with release = 'prototypes' only")
        if self.nonnegative_rows and self.preprocessing != "none":
            raise ValueError(
                "nonnegative_rows: standardized rows are not non-negative (ask for one or the "
                "other)"
            )
        if self.nonnegative_rows and self.projection != "source":
            # a projection (the target's basis, a JL matrix) takes rows out of the orthant
            raise ValueError(
                "nonnegative_rows: offered with projection = 'source' only (a projected row "
                "is not non-negative)"
            )
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


def term_default(name: str) -> Any:
    """The default ``SessionTerms`` declares for the term ``name`` (an enum's value), for every
    other surface that offers the term; ``None`` for a term whose default follows the unit and
    the release."""
    if name in RELEASE_DEPENDENT:
        return None
    field = SessionTerms.model_fields[name]
    if field.is_required():
        raise ValueError(f"{name}: every session states it; the terms declare no default")
    default = field.get_default(call_default_factory=True)
    return default.value if isinstance(default, Enum) else default


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
    """The sinkhorn-synthetic knobs of a session (public: both parties read them); a field named
    like a term (``synthetic_points``) is that term."""
    return SinkhornSyntheticParams(
        synthetic_points=terms.synthetic_points,
        rows_per_point=terms.synthetic_rows_per_point,
        steps=terms.sinkhorn_steps,
        reg=terms.sinkhorn_reg,
        debias=terms.sinkhorn_debias,
        learning_rate=terms.sinkhorn_learning_rate,
        clip_norm=terms.clip_norm,
    )


def metric_params(terms: SessionTerms) -> MetricParams:
    """The metric knobs of a session (public: both parties read them); a field named like a term
    (``metric_clip``) is that term."""
    return MetricParams(
        dim=terms.metric_rows,
        pairs_per_record=terms.metric_pairs,
        margin=terms.metric_margin,
        metric_clip=terms.metric_clip,
        steps=terms.metric_steps,
        learning_rate=terms.metric_learning_rate,
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
