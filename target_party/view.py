"""What a target job adapts with: its settings (``AdaptConfig``), what PATE may send about its
rows (``RowQueries``), the target's rows in its own representation and scaling
(``TargetView``), the spaces releases are fitted in, and the session terms the target decides
from its own rows before it asks for anything."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from dpda.data import preprocessing as _pre
from dpda.data.loaders import Domain
from dpda.data.preprocessing import NONNEGATIVE_REPRESENTATIONS, Scaling, by_row_blocks, per_row
from dpda.dp.preprocessing_dp import Standardization, exact_standardization
from dpda.dp.target_disclosure import Disclosure
from dpda.errors import ConfigError
from dpda.planner import plan_batches
from dpda.service.config import TargetJob
from dpda.terms import AUTO_CELL_NOISE, AUTO_CELLS, SessionTerms

log = logging.getLogger("dpda.target")


def _job_default(name: str) -> Any:
    """The default the target's [job] table declares for the knob ``name``."""
    return TargetJob.model_fields[name].default


@dataclass(frozen=True)
class AdaptConfig:
    """How a job adapts. The knobs a [job] table offers (``ADAPT_KNOBS``) take its defaults,
    declared once by ``TargetJob``.

    Parameters
    ----------
    reg_e : float, default 0.02
        The transport's entropic regularization, on the max-normalized cost; positive.
    reg_g : float, default 0.5
        The transport's group-lasso (class) regularization; non-negative.
    outer_iter : int, default 10
        The most outer (conditional gradient) steps of the group-lasso transport; positive.
    inner_iter : int, default 200
        The most iterations of each inner Sinkhorn solve; positive.
    inner_tol : float, default 0.00025
        The L1 marginal error at which each inner Sinkhorn solve stops; positive.
    outer_tol : float, default 0.001
        The relative change of the group-lasso objective at which the outer loop stops
        (``outer_iter`` stays the cap); positive.
    warm_batches : bool, default True
        Start each minibatch's first Sinkhorn solve from the target-side potentials of the
        session's first fit (when every target row is in the plan).
    classifier : str, default '1nn'
        The model the job trains: on the adapted class points (or mapped source rows),
        ``1nn``, ``logistic`` or ``mlp``; on the target's own rows labeled by the transport,
        ``target-logistic``, ``target-knn`` or ``target-spread``.
    seed : int, default 0
        The seed of the target's own draws (its classifier, subsamples and row choices).
    pate_select : {'confident', 'uncertain', 'random'}, default 'confident'
        DPDA+PATE: the target rows the teachers are asked about, the most or the least certain
        under the plan, or rows at random (``dp`` row queries are always drawn at random).
    pate_query : {'backmapped', 'target'}, default 'backmapped'
        DPDA+PATE, exact projected queries: what is sent for each row, its image under the
        plan (``backmapped``) or its own projection (``target``).
    pate_agree : bool, default True
        DPDA+PATE: keep only the teachers' labels that agree with the plan's class.
    clip_quantile : float, default 0.9
        The record unit with ``projection='target-pca'``: the clipping norm C is this quantile
        of the norms of the target's projected rows (with DP disclosures, their DP root mean
        square), in [0, 1]; 0 keeps the terms' ``clip_norm``.
    synthetic_per_class : int, default 200
        ``class-gaussians``: the most points drawn per class; positive.
    target_batch : int, default 0
        ``rows`` releases: each release is transported onto this many target rows drawn at
        random, at least 0; 0: onto all of them. Not combined with PATE queries (refused).
    select : {'circular', 'none'}, default 'circular'
        How (``reg_e``, ``reg_g``) are chosen on the received releases without target labels:
        ``circular`` scores a grid of pairs by how well the target's pseudo-labels predict
        the source's noisy points back; ``none`` keeps ``reg_e`` and ``reg_g``.
    transport_step : float, default 0.5
        Aggregate releases: how far each class point moves from itself toward its barycentric
        image under the plan, in [0, 1] (1: the image); refused outside.
    refine : float, default 0.5
        Aggregate releases: how far each class point then moves toward the mean of the target
        rows it labels, in [0, 1] (0: not at all); refused outside.
    keep : {'better', 'dpda'}, default 'better'
        The model kept: ``dpda``, the adapted one; ``better``, whichever of it and the same
        release used without adaptation the label-free estimate scores higher; refused
        otherwise.
    """

    reg_e: float = _job_default("reg_e")  # entropic strength on the max-normalized cost
    reg_g: float = _job_default("reg_g")  # group-lasso strength
    outer_iter: int = 10
    inner_iter: int = 200
    # L1 marginal error at which each inner Sinkhorn solve stops: a quarter of the plan's own
    # tolerance (1e-3), so the plan still converges (docs/results.md, "Where the constants
    # come from")
    inner_tol: float = 2.5e-4
    # relative change of the group-lasso objective at which the outer loop stops, once the
    # step before it changed it by less than ten times that (the plan's own convergence;
    # ``outer_iter`` stays the cap). Past it each further step moves the objective by well
    # under a tenth of a percent while costing a kernel build, a direction pass and a
    # Sinkhorn solve (dpda bench speed --visda: docs/results.md)
    outer_tol: float = 1e-3
    # warm-start each minibatch's first Sinkhorn solve from the target-side potentials of the
    # session's first fit (same target rows, same marginal; only when every target row is in
    # the plan). Always the first fit, so the fits stay independent of one another and of the
    # number of workers (on a cluster they still run side by side)
    warm_batches: bool = True
    classifier: str = _job_default("classifier")
    seed: int = 0
    # DPDA+PATE: which target rows to ask the teachers about, and what to send for each
    # (defaults measured on the 12 Office-Caltech pairs; see the README)
    pate_select: str = "confident"  # uncertain | confident | random
    pate_query: str = "backmapped"  # target: the row's projection; backmapped: its plan image
    pate_agree: bool = True  # keep only teacher labels that agree with the plan's class
    # record unit: the target picks the clipping norm C as this quantile of the norms of its own
    # projected rows (public to the source: the target's choice); 0 keeps the terms' clip_norm
    clip_quantile: float = 0.9
    synthetic_per_class: int = 200  # class-gaussians: points drawn per class (at most)
    # minibatch OT on the target side too: each release is transported onto this many target
    # rows drawn at random (0: all of them). Post-processing; keeps a batch's plan small when the
    # target is large (VisDA scale). Not combined with PATE queries.
    target_batch: int = 0
    # unsupervised choice of (reg_e, reg_g) on the received releases (post-processing, no
    # budget): "circular" scores each pair of dpda.target_party.selection.GRID by how well the
    # target's pseudo-labels predict the source's own (noisy) points back; "none" keeps
    # reg_e / reg_g. Skipped, and said, above SELECT_MAX_CELLS plan entries per solve round.
    select: str = _job_default("select")
    # aggregate releases: each class point's training image is this far along the way from the
    # point itself (in the target's space) to its barycentric image under the plan; 1 is the
    # barycentric map alone. Halfway, the noisy class means keep what they know of the classes
    # while the plan moves them onto the target's mass (dpda bench accuracy: docs/results.md)
    transport_step: float = _job_default("transport_step")
    # aggregate releases: then each class point moves this far towards the mean of the target
    # rows it labels (one self-labelling step on the target's own rows, post-processing; 0:
    # none). Halfway, a point keeps what the release knows of its class while the target's
    # own clusters pull it onto them (dpda bench accuracy --protocol defaults: docs/results.md)
    refine: float = _job_default("refine")
    # which model the job keeps: "dpda" (the adapted one), or "better": the one the label-free
    # estimate (``adaptation_estimate``) scores higher, DPDA or the same release used without
    # adaptation (both post-processing of the same release: no budget)
    keep: str = _job_default("keep")

    def __post_init__(self) -> None:
        """The two knobs the job's config, the CLI and the estimator pass through unchecked."""
        if not (0.0 <= self.transport_step <= 1.0):  # NaN too
            raise ConfigError(f"transport_step: {self.transport_step!r} is not in [0, 1]")
        if not (0.0 <= self.refine <= 1.0):
            raise ConfigError(f"refine: {self.refine!r} is not in [0, 1]")
        if self.keep not in ("dpda", "better"):
            raise ConfigError(f"keep: {self.keep!r} is not dpda or better")


# the knobs of AdaptConfig a job's [job] table, ``dpda simulate``'s flags and the estimator's
# parameters offer, each by the same name
ADAPT_KNOBS = ("reg_e", "reg_g", "classifier", "select", "transport_step", "refine", "keep")


def adapt_default(name: str) -> Any:
    """The default ``AdaptConfig`` declares for ``name``."""
    return AdaptConfig.__dataclass_fields__[name].default


def adapt_config(settings: object, seed: int) -> AdaptConfig:
    """The AdaptConfig of a job's settings (a [job] table, parsed flags, an estimator): each knob
    of ``ADAPT_KNOBS`` that ``settings`` has, by its name; AdaptConfig's defaults for the rest."""
    knobs = {name: getattr(settings, name) for name in ADAPT_KNOBS if hasattr(settings, name)}
    return AdaptConfig(seed=seed, **knobs)


@dataclass(frozen=True)
class RowQueries:
    """What PATE may send about the target's rows: its ``[privacy] row_queries``.

    - ``exact``: the chosen rows, projected (or their plan images), as computed (the opt-in);
    - ``dp``: a random subset of rows drawn from the job's seed (never from the data), clipped
      and noised by ``protect`` (session id, rows, clip norm) → the rows to send; the target's
      app charges its own ledger there first (``dpda.dp.target_disclosure.noisy_rows``);
    - ``synthetic``: ``pate_queries`` points drawn from N(0, diag(``variances``)) in the
      projected space (released statistics only); the teachers label them, a student trained
      on them labels the target's rows locally.
    """

    mode: str = "exact"  # exact | dp | synthetic
    protect: Callable[[str, np.ndarray, float], np.ndarray] | None = None
    variances: np.ndarray | None = None
    # synthetic: called with (session id, points) before they leave (the target's own record)
    record: Callable[[str, np.ndarray], np.ndarray] | None = None


@dataclass(frozen=True)
class TargetView:
    """The target's data in its own representation (its raw feature space for mapping)."""

    x: np.ndarray  # (m, d) preprocessed target features
    scaling: Scaling
    labels: np.ndarray | None  # evaluation labels, if any
    known: np.ndarray  # (m,) −1 or a label the target knows (semi-supervised)
    # the target's statistics released under its own DP: scaling, basis, clip norm; None: the
    # exact ones are disclosed (the target's opt-in), or nothing is (source-space releases)
    disclosure: Disclosure | None = None
    representation: str = "raw"  # the per-row representation ``x`` was computed from
    # a source-space session's C: the target's rows are clipped to it as the source's are, so
    # the release, the OT space and the classifier (and the saved model) share one space
    clip_norm: float | None = None
    # preprocessing = standardize: the target's own exact statistics of the kind the source
    # learns under DP (``dpda.dp.preprocessing_dp``); ``x`` is computed from the rows they map
    standardization: Standardization | None = None
    # with a standardization: the rows before it and the column scaling's mode, so that the
    # view can move into the source's standardized space (``adopt``)
    raw: np.ndarray | None = None
    scaling_mode: str = "zscore"

    def adopt(self, loc: np.ndarray, scale: np.ndarray, clip_norm: float) -> TargetView:
        """The same rows standardized with the source's DP statistics (sent with its release,
        already paid for) instead of the target's own: both parties' rows in one space, as the
        non-private baselines put them (post-processing on the target's side)."""
        if self.raw is None:
            return self
        st = Standardization(loc, scale, clip_norm, 0.0, 0.0)
        rep = st.apply(self.raw)
        scaling = Scaling.of(rep, self.scaling_mode)
        return replace(self, x=_scale_inplace(rep, scaling), scaling=scaling, standardization=st)

    @cached_property
    def x32(self) -> np.ndarray:
        """``x`` in float32, made once: what each fit's barycentric map multiplies its float32
        plan with."""
        return np.ascontiguousarray(self.x, dtype=np.float32)

    def rows(self) -> np.ndarray:
        """The target's rows in the per-row representation (before its column scaling)."""
        return self.x * self.scaling.std + self.scaling.mean


def target_view(
    target: Domain,
    representation: str,
    known: np.ndarray | None = None,
    scaling_mode: str = "zscore",
    disclosure: Disclosure | None = None,
    terms: SessionTerms | None = None,
) -> TargetView:
    """The target's rows in its representation and scaling: the DP scaling (and basis) of a
    ``disclosure`` (``dpda.dp.target_disclosure``), else the exact ones. For a source-space
    session (``terms``) the rows are first clipped to its C, as the source clips its own (a
    no-op for norm-1 representations)."""
    from dpda.dp.mechanisms import clip_rows

    clip = None
    st = None
    raw = None
    standardize = (
        terms is not None and resolve_preprocessing(terms, representation) == "standardize"
    )
    if not standardize and terms is not None and terms.source_space:
        clip = natural_clip(representation, terms.clip_norm)

    def rows(part: np.ndarray) -> np.ndarray:
        r = per_row(part, representation)
        return clip_rows(r, clip) if clip is not None else r

    if standardize and representation == "raw":
        # the raw representation is the rows themselves: kept for ``adopt`` as they are, no
        # copy (nothing below writes into them)
        rep = np.asarray(target.x, dtype=np.float64)
    else:
        # per-row maps, a block of rows at a time into one array: the view's memory is its
        # rows and a block, not the several whole-table temporaries the maps make
        rep = by_row_blocks(target.x, rows)
    if standardize:
        st, raw = exact_standardization(rep), rep
        rep, clip = st.apply(rep), 1.0  # every row in the unit ball, as the source's
    kn = np.full(rep.shape[0], -1, dtype=np.int64) if known is None else known
    if disclosure is not None:
        d = disclosure
        scaled = _scale_inplace(rep, d.scaling)
        return TargetView(
            scaled, d.scaling, target.y, kn, d, representation, clip, st, raw, scaling_mode
        )
    scaling = Scaling.of(rep, scaling_mode)
    return TargetView(
        _scale_inplace(rep, scaling), scaling, target.y, kn, None, representation, clip, st,
        raw, scaling_mode,
    )  # fmt: skip


def _scale_inplace(x: np.ndarray, scaling: Scaling) -> np.ndarray:
    """``scaling.apply(x)`` computed in ``x`` itself (the same arithmetic, no copy)."""
    x -= scaling.mean
    x /= scaling.std
    return x


def resolve_preprocessing(terms: SessionTerms, representation: str) -> str:
    """The preprocessing a source-space session runs under: the terms' own when they say,
    else ``standardize`` for raw rows (columns of any scale, no natural row bound) released
    with the exact calibration, and ``none`` otherwise (a public rule of the representation)."""
    if not terms.source_space:
        return "none"
    if "preprocessing" in terms.model_fields_set:
        return terms.preprocessing
    return "standardize" if representation == "raw" and terms.calibration == "exact" else "none"


@dataclass(frozen=True)
class LocalSpace:
    """The target's own OT space for a release computed in the source's per-row space: rows
    clipped to the session's norm C (as the source clips its own), the target's column
    scaling, then its top-ℓ principal directions. Computed from the target's rows alone and
    never sent: bringing the release into it is post-processing."""

    scaling: Scaling
    basis: np.ndarray  # (k, ℓ), orthonormal columns

    def __call__(self, pts: np.ndarray) -> np.ndarray:
        """Points of the source's per-row space (noisy class means, drawn points) → OT space."""
        return np.asarray(self.scaling.apply(pts) @ self.basis)


def local_space(view: TargetView, clip_norm: float, ell: int) -> tuple[LocalSpace, np.ndarray]:
    """(The map, the target's rows in the OT space) for a source-space session."""
    from dpda.dp.mechanisms import clip_rows

    sc = view.scaling

    def clipped(part: np.ndarray) -> np.ndarray:  # a block of view.rows(), clipped and scaled
        return _scale_inplace(clip_rows(part * sc.std + sc.mean, clip_norm), sc)

    scaled = by_row_blocks(view.x, clipped)
    basis = target_pca_basis(scaled, ell)
    return LocalSpace(view.scaling, basis), scaled @ basis


def resolve_scaling(mode: str, terms: SessionTerms, fallback: str = "zscore") -> str:
    """The column scaling a job runs under: ``auto`` is uniform for a source-space release
    (its noise is the same in every direction of the source's space; z-score would stretch it
    along the target's quiet columns) and ``fallback`` otherwise."""
    if mode != "auto":
        return mode
    return "uniform" if terms.source_space else (fallback if fallback != "auto" else "zscore")


def natural_clip(representation: str, clip_norm: float) -> float:
    """C for a source-space release: the representation's natural row bound (norm-1 rows),
    else the configured ``clip_norm`` (raw features: a public bound on the rows' norms)."""
    from dpda.dp.target_disclosure import NATURAL_CLIP

    return NATURAL_CLIP.get(representation, clip_norm)


def target_pca_basis(x: np.ndarray, ell: int) -> np.ndarray:
    """Top-ℓ right singular vectors of the centred target data: (d, ℓ), orthonormal columns.

    Up to ``PCA_SVD_ROWS`` rows, by the SVD of the centred rows; above, as the top eigenvectors
    of their ``d × d`` scatter matrix accumulated a block of rows at a time (the same directions
    up to sign and rounding; the SVD would hold two more copies of the rows)."""
    if x.shape[0] <= PCA_SVD_ROWS:
        xc = x - x.mean(axis=0)
        _, _, vt = np.linalg.svd(xc, full_matrices=False)
        return np.ascontiguousarray(vt[:ell].T)
    mu = x.mean(axis=0)
    scatter = np.zeros((x.shape[1], x.shape[1]))
    block = _pre.ROW_BLOCK
    for i in range(0, x.shape[0], block):
        b = x[i : i + block] - mu
        scatter += b.T @ b
    w, v = np.linalg.eigh(scatter)
    top = v[:, np.argsort(w)[::-1][:ell]]
    # a fixed sign: each direction's largest entry positive (the SVD's sign is arbitrary too)
    top *= np.sign(top[np.argmax(np.abs(top), axis=0), np.arange(top.shape[1])])
    return np.ascontiguousarray(top)


PCA_SVD_ROWS = 50_000  # above it, the basis from the scatter matrix (linear memory)


def auto_cells(terms: SessionTerms, n_rows: int, n_classes: int, n_features: int) -> int:
    """The cells a source-space prototypes job on standardized rows asks for when it leaves
    ``cells`` out: the largest K ≤ ``AUTO_CELLS`` whose (class, cell) means, at the source's
    public size (``n_rows`` rows, ``n_classes`` classes, ``n_features`` columns) and the
    release's σ (the plan's, the same for every K), carry noise of norm σ·√k·q·K / n at most
    ``AUTO_CELL_NOISE`` (rows in the unit ball); 1 when none does. Public facts only."""
    if n_rows < 1 or n_classes < 1:
        return 1
    # the plan reads the source's width, not the matrix (``dpda target plan`` plans the same)
    basis = np.eye(n_features, 1)
    plan = plan_batches(terms.model_copy(update={"cells": 1}), n_rows, basis)
    std = plan.spec(terms).features.noise_std
    per_cell = std * np.sqrt(n_features) * n_classes / (n_rows * terms.clip_norm)
    fits = [k for k in range(AUTO_CELLS, 1, -1) if per_cell * k <= AUTO_CELL_NOISE]
    return fits[0] if fits else 1


def session_terms(
    view: TargetView,
    terms: SessionTerms,
    cfg: AdaptConfig,
    source_rows: tuple[int, int] | None = None,
) -> tuple[SessionTerms, np.ndarray | None]:
    """What the target decides from its own rows before it opens a session (and ``dpda target
    plan`` before anything is asked): the target-pca basis — at most as many directions as the
    target has features and rows; a larger ``projection_dim`` is lowered to that, and said —
    and, under the record unit, the clipping norm as a quantile of its projected rows.
    ``source_rows``: the source's published (rows, classes), from which a job on raw rows the
    source standardizes picks its ``cells`` (``auto_cells``) when it leaves them out."""
    most = min(view.x.shape)
    if terms.source_space:  # nothing of the target is sent; C is a public bound
        pre = resolve_preprocessing(terms, view.representation)
        update: dict[str, Any] = {
            "projection_dim": min(terms.projection_dim, most),
            # standardized rows are divided by their C: the unit ball
            "clip_norm": 1.0
            if pre != "none"
            else natural_clip(view.representation, terms.clip_norm),
            "preprocessing": pre,
        }
        if "nonnegative_rows" not in terms.model_fields_set:
            # rows that are non-negative by construction: the source's clamp changes nothing
            # and the same-label bound is √2·C (a public rule of the representation)
            update["nonnegative_rows"] = (
                pre == "none" and view.representation in NONNEGATIVE_REPRESENTATIONS
            )
        terms = terms.model_copy(update=update)
        if (
            "cells" not in terms.model_fields_set
            and terms.release == "prototypes"
            and pre != "none"
            and source_rows is not None
        ):
            cells = auto_cells(terms, *source_rows, view.x.shape[1])
            terms = terms.model_copy(update={"cells": cells})
        return terms, None
    if terms.projection == "target-pca" and terms.projection_dim > most:
        log.warning(
            "projection_dim %d is more than the target's data allows (%d features, %d rows): "
            "using %d",
            terms.projection_dim,
            view.x.shape[1],
            view.x.shape[0],
            most,
        )
        update = {"projection_dim": most}
        if terms.metric_dim > most:  # W has at most as many rows as the projected space
            update["metric_dim"] = most
        terms = terms.model_copy(update=update)
    d = view.disclosure
    if d is not None:  # the DP basis and clip norm (post-processing of the noisy covariance)
        basis = None
        if terms.projection == "target-pca":
            basis = d.basis[:, : terms.projection_dim]
            if terms.privacy_unit == "record" and cfg.clip_quantile > 0:
                terms = terms.model_copy(update={"clip_norm": d.clip_norm})
        return terms, basis
    basis = (
        target_pca_basis(view.x, terms.projection_dim) if terms.projection == "target-pca" else None
    )
    if terms.privacy_unit == "record" and cfg.clip_quantile > 0 and basis is not None:
        norms = np.linalg.norm(view.x @ basis, axis=1)
        terms = terms.model_copy(update={"clip_norm": float(np.quantile(norms, cfg.clip_quantile))})
    return terms, basis
