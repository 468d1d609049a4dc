"""The DPDA job on the target: releases → debiased cost → entropic + group-lasso OT →
barycentric images in the target's own space → a local classifier.

The job takes *a source of releases* behind one small interface (``ReleaseSource``) with two
implementations: the in-process ``SourceReleaser`` and the gRPC client. Everything it computes
from releases is post-processing and costs no budget.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling, per_row
from dpda.dp.events import BatchSpec
from dpda.dp.mechanisms import counts_to_labels
from dpda.dp.sinkhorn_synthetic import SinkhornSyntheticParams, synthetic_labels
from dpda.dp.target_disclosure import Disclosure
from dpda.errors import ConfigError, PeerMisbehaved
from dpda.ot.costs import dpot_cost, label_mask
from dpda.ot.fast import SinkhornState
from dpda.ot.mapping import barycentric_map
from dpda.ot.solvers import one_hot, sinkhorn_group_lasso, uniform
from dpda.protocol import BatchRelease, ReleaseSource, SessionInfo, TargetDisclosure
from dpda.target_party.compute import Compute, split_rows
from dpda.target_party.selection import select
from dpda.target_party.training import accuracy, fit_predict
from dpda.terms import SessionTerms, synthetic_params

log = logging.getLogger("dpda.target")


@dataclass(frozen=True)
class AdaptConfig:
    reg_e: float = 0.02  # entropic strength on the max-normalized cost
    reg_g: float = 0.5  # group-lasso strength
    outer_iter: int = 10
    inner_iter: int = 200
    # L1 marginal error at which each inner Sinkhorn solve stops: a quarter of the plan's own
    # tolerance (1e-3), so the plan still converges (measured on a 1,000 × 50,000 batch: the
    # same plan as at 1e-6 to within 1e-4 of its mass, in 40% of the passes)
    inner_tol: float = 2.5e-4
    # warm-start each minibatch's first Sinkhorn solve from the target-side potentials of the
    # session's first fit (same target rows, same marginal; only when every target row is in
    # the plan). Always the first fit, so the fits stay independent of one another and of the
    # number of workers (on a cluster they still run side by side)
    warm_batches: bool = True
    classifier: str = "1nn"
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
    select: str = "circular"
    # aggregate releases: each class point's training image is this far along the way from the
    # point itself (in the target's space) to its barycentric image under the plan; 1 is the
    # barycentric map alone. Halfway, the noisy class means keep what they know of the classes
    # while the plan moves them onto the target's mass (dpda bench accuracy: docs/results.md)
    transport_step: float = 0.5
    # aggregate releases: then each class point moves this far towards the mean of the target
    # rows it labels (one self-labelling step on the target's own rows, post-processing; 0:
    # none). Halfway, a point keeps what the release knows of its class while the target's
    # own clusters pull it onto them (dpda bench accuracy --protocol defaults: docs/results.md)
    refine: float = 0.5
    # which model the job keeps: "dpda" (the adapted one), or "better": the one the label-free
    # estimate (``adaptation_estimate``) scores higher, DPDA or the same release used without
    # adaptation (both post-processing of the same release: no budget)
    keep: str = "better"

    def __post_init__(self) -> None:
        """The two knobs the job's config, the CLI and the estimator pass through unchecked."""
        if not (0.0 <= self.transport_step <= 1.0):  # NaN too
            raise ConfigError(f"transport_step: {self.transport_step!r} is not in [0, 1]")
        if not (0.0 <= self.refine <= 1.0):
            raise ConfigError(f"refine: {self.refine!r} is not in [0, 1]")
        if self.keep not in ("dpda", "better"):
            raise ConfigError(f"keep: {self.keep!r} is not dpda or better")


@dataclass(frozen=True)
class RowQueries:
    """What PATE may send about the target's rows: its ``[privacy] row_queries`` (issue 19).

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

    rep = per_row(target.x, representation)
    clip = None
    if terms is not None and terms.source_space:
        clip = natural_clip(representation, terms.clip_norm)
        rep = clip_rows(rep, clip)
    kn = np.full(rep.shape[0], -1, dtype=np.int64) if known is None else known
    if disclosure is not None:
        d = disclosure
        return TargetView(d.scaling.apply(rep), d.scaling, target.y, kn, d, representation, clip)
    scaling = Scaling.of(rep, scaling_mode)
    return TargetView(scaling.apply(rep), scaling, target.y, kn, None, representation, clip)


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

    scaled = view.scaling.apply(clip_rows(view.rows(), clip_norm))
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
    """Top-ℓ right singular vectors of the centred target data: (d, ℓ), orthonormal columns."""
    xc = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    return np.ascontiguousarray(vt[:ell].T)


@dataclass(frozen=True)
class FitTraffic:
    """What a job's fits did, summed over its batches: the counts ``dpda bench speed --visda``
    and ``dpda bench scale`` print beside the bytes-over-bandwidth bound."""

    fits: int = 0
    kernel_builds: int = 0
    passes: int = 0  # passes over a kernel: one per Sinkhorn iteration
    bytes_read: int = 0  # bytes of plan-sized arrays read (solver, cost, products)
    pass_bytes: int = 0  # bytes the passes alone must read (passes × plan bytes)
    seconds: float = 0.0  # the fits' own time (where they ran)

    @classmethod
    def of(cls, fits: list[BatchFit]) -> FitTraffic:
        return cls(
            fits=len(fits),
            kernel_builds=sum(f.kernel_builds for f in fits),
            passes=sum(f.passes for f in fits),
            bytes_read=sum(f.bytes_read for f in fits),
            pass_bytes=sum(f.pass_bytes for f in fits),
            seconds=float(sum(f.seconds for f in fits)),
        )

    def to_json(self) -> dict[str, float]:
        per = max(self.fits, 1)
        return {
            "fits": self.fits,
            "kernel_builds_per_fit": self.kernel_builds / per,
            "passes_per_fit": self.passes / per,
            "bytes_read_per_fit": self.bytes_read / per,
            "pass_bytes_per_fit": self.pass_bytes / per,
            "read_over_pass_bytes": self.bytes_read / max(self.pass_bytes, 1),
            "seconds_per_fit": self.seconds / per,
        }


@dataclass(frozen=True)
class DPDAResult:
    accuracy: float | None  # of the job's final model (DPDA+PATE > DPDA > PATE student)
    epsilon_spent: float
    delta: float
    noise_multiplier: float
    noise_std: float
    projection_dim: int
    n_batches: int
    rows_received: int
    w_tilde: float  # mean over batches of ⟨γ, C̃⟩ (nan without DPDA releases)
    solver_converged: bool
    predictions: np.ndarray
    mapped: np.ndarray = field(repr=False)
    mapped_labels: np.ndarray = field(repr=False)
    noisy_counts: list[list[int]] = field(default_factory=list, repr=False)
    batch_spend: list[float] = field(default_factory=list, repr=False)
    accuracy_by_method: dict[str, float | None] = field(default_factory=dict)
    pate_queries: int = 0
    model: object = field(default=None, repr=False)  # the job's final classifier
    terms: SessionTerms | None = None  # the terms the session ran under (clip norm chosen)
    session_id: str = ""
    selection: dict[str, Any] = field(default_factory=dict)  # the unsupervised model choice
    # DPDA next to the same release without adaptation (``_without_adaptation``)
    adaptation: dict[str, Any] = field(default_factory=dict, repr=False)
    release_seconds: float = 0.0  # wall time of the source's releases (charge + draw + transfer)
    source_seconds: float = 0.0  # wall time of every call to the source (``_TimedSource``)
    # what was transported, in the session's projected space, and the target's rows there
    source_points: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    source_point_labels: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False
    )
    target_projected: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    fit_traffic: FitTraffic = field(default_factory=FitTraffic)

    def summary(self, asked: SessionTerms) -> dict[str, Any]:
        """The numbers of one run, as ``results.json`` and ``dpda simulate --json`` report them
        (the one place they are named)."""
        ran = self.terms or asked
        return {
            "accuracy": self.accuracy,
            "epsilon_spent": self.epsilon_spent,
            "delta": self.delta,
            "sigma": self.noise_multiplier,
            "noise_std": self.noise_std,
            "projection": asked.projection,
            "projection_dim": self.projection_dim,
            "privacy_unit": asked.privacy_unit,
            "neighbouring": asked.neighbouring,
            "release": asked.release,
            "clip_norm": ran.clip_norm if asked.privacy_unit == "record" else None,
            "batches": self.n_batches,
            "rows_received": self.rows_received,
            "w_tilde": self.w_tilde,
            "solver_converged": self.solver_converged,
            "pate_queries": self.pate_queries,
            "accuracy_by_method": self.accuracy_by_method,
            "reg_e": self.selection.get("reg_e"),
            "reg_g": self.selection.get("reg_g"),
            "selection": self.selection,
            "adaptation": {k: v for k, v in self.adaptation.items() if k != "predictions"},
            "caveat": ran.caveat,
        }


@dataclass(frozen=True)
class BatchFit:
    mapped: np.ndarray  # (n, d) in the target's space
    labels: np.ndarray  # (n,) from the noisy counts
    w_tilde: float
    converged: bool
    class_mass: np.ndarray  # (q, m): mass each class sends to each target row
    back_mapped: np.ndarray  # (m, ℓ): each target row's image among the noisy source rows
    points: np.ndarray  # (n, ℓ) the source points transported (noisy rows, prototypes, …)
    weights: np.ndarray  # (n,) their masses
    # what the fit read (the solver's passes plus the cost's normalization and the three
    # products with the plan: images, class masses, back-mapped rows)
    kernel_builds: int = 0
    passes: int = 0
    bytes_read: int = 0
    pass_bytes: int = 0  # what the passes alone must read: passes × the plan's bytes
    seconds: float = 0.0  # the fit's own time, where it ran
    # target-side potentials of the first entropic solve, in the raw cost's units (the warm
    # start of a later batch's fit); None when the fit covers a subset of the target's rows
    warm: np.ndarray | None = None


def fit_points(
    pts: np.ndarray,
    ys: np.ndarray,
    a: np.ndarray,
    noise_std: float,
    xt_proj: np.ndarray,
    view: TargetView,
    cfg: AdaptConfig,
    n_classes: int,
    metric: np.ndarray | None = None,
    warm: np.ndarray | None = None,
) -> BatchFit:
    """Labeled source points (noisy rows, prototypes or synthetic points) with weights ``a``
    → debiased cost → entropic + group-lasso OT → images in the target's own space.

    ``metric``: the session's learned W (``d′ × ℓ``): the cost is ``‖W(z_s − z_t)‖²`` (both
    sides mapped by W, then squared Euclidean; the noise bias becomes ``σ²‖W‖_F²``); the plan
    still maps the source onto the target's own rows. ``warm``: an earlier fit's ``warm`` onto
    the same target rows (the first Sinkhorn solve starts from it; the plan does not depend
    on it beyond the solver's tolerance). A pure function of its arguments."""
    t0 = time.perf_counter()
    mask = label_mask(ys, view.known) if np.any(view.known >= 0) else None
    if metric is None:
        cost = dpot_cost(pts, xt_proj, noise_std, mask)
    else:
        std = noise_std * float(np.linalg.norm(metric)) / np.sqrt(metric.shape[0])
        cost = dpot_cost(pts @ metric.T, xt_proj @ metric.T, std, mask)
    m = xt_proj.shape[0]
    start = None
    if warm is not None and warm.shape == (m,):
        start = SinkhornState(np.zeros(pts.shape[0]), warm / cost.scale)
    res = sinkhorn_group_lasso(
        a,
        uniform(m),
        cost.normalized,
        ys,
        cfg.reg_e,
        cfg.reg_g,
        outer_iter=cfg.outer_iter,
        inner_iter=cfg.inner_iter,
        inner_tol=cfg.inner_tol,
        start=start,
    )
    plan = res.plan
    mass = float(a.sum())
    out = res.start_state
    return BatchFit(
        mapped=barycentric_map(plan, view.x),
        labels=ys,
        # W̃ = ⟨γ, C̃⟩ from the solver's own ⟨γ, C/scale⟩ (no further pass over the plan)
        w_tilde=cost.scale * res.transport_cost - cost.bias * mass,
        converged=res.converged,
        class_mass=one_hot(ys, n_classes).astype(plan.dtype).T @ plan,
        back_mapped=barycentric_map(plan.T, pts),
        points=pts,
        weights=a,
        kernel_builds=res.kernel_builds,
        passes=res.passes,
        # + the cost's normalization (its maximum, then the division) and the three products
        bytes_read=res.bytes_read + 2 * cost.normalized.nbytes + 3 * plan.nbytes,
        pass_bytes=res.passes * plan.nbytes,
        seconds=time.perf_counter() - t0,
        warm=None if out is None else out.beta * cost.scale,
    )


def aggregate_points(
    rel: BatchRelease,
    release: str,
    n_classes: int,
    seed: int,
    per_class: int,
    synthetic: SinkhornSyntheticParams | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Noisy class aggregates → (points (p, ℓ), labels (p,), weights (p,)), post-processing.

    ``prototypes``: one mean per class, weighted by its noisy count. ``class-gaussians``: points
    drawn from a diagonal Gaussian per class (noisy mean and variance), equal weights.
    ``sinkhorn-synthetic``: the released points as they are, each class's mass its noisy count
    shared equally by its points.
    """
    counts = np.asarray(rel.noisy_counts, dtype=float)
    if release == "sinkhorn-synthetic":
        if synthetic is None:
            raise ValueError("sinkhorn-synthetic points need the session's parameters")
        labels = synthetic_labels(
            rel.noisy_counts, synthetic.points_per_class, synthetic.rows_per_point
        )
        share = counts.clip(1.0)[labels]
        share = share / np.bincount(labels, minlength=n_classes)[labels]
        return rel.z, labels, share / share.sum()
    ell = rel.z.shape[1] if release == "prototypes" else rel.z.shape[1] // 2
    keep = np.flatnonzero(counts >= 1)
    if keep.size == 0:
        keep = np.arange(n_classes)
    n = np.maximum(counts[keep], 1.0)[:, None]
    means = rel.z[keep, :ell] / n
    if release == "prototypes":
        w = counts[keep].clip(1.0)
        return means, keep.astype(np.int64), w / w.sum()
    var = rel.z[keep, ell:] / n - means**2
    floor = max(float(np.median(var[var > 0])) if np.any(var > 0) else 1e-3, 1e-6) * 0.05
    var = np.maximum(var, floor)
    rng = np.random.default_rng(seed)
    sizes = np.minimum(np.rint(counts[keep]).astype(int), per_class).clip(1)
    pts = [
        m + rng.normal(size=(k, ell)) * np.sqrt(v)
        for m, v, k in zip(means, var, sizes, strict=True)
    ]
    labels = np.repeat(keep, sizes).astype(np.int64)
    x = np.vstack(pts)
    return x, labels, np.full(x.shape[0], 1.0 / x.shape[0])


def select_rows(class_mass: np.ndarray, k: int, how: str, seed: int) -> np.ndarray:
    """``k`` target rows: least (``uncertain``) or most (``confident``) certain under the plan's
    class shares, or ``random``."""
    share = class_mass / np.maximum(class_mass.sum(axis=0, keepdims=True), 1e-300)
    certainty = share.max(axis=0)
    if how == "uncertain":
        return np.argsort(certainty, kind="stable")[:k]
    if how == "confident":
        return np.argsort(-certainty, kind="stable")[:k]
    if how == "random":
        return np.random.default_rng(seed).choice(class_mass.shape[1], k, replace=False)
    raise ValueError(f"unknown selection {how!r}")


def _train(view: TargetView, x_src: np.ndarray, y_src: np.ndarray, cfg: AdaptConfig):
    """(model, predictions on every target row) from mapped rows plus labeled target rows."""
    known = view.known >= 0
    x_train = np.vstack([x_src, view.x[known]])
    y_train = np.concatenate([y_src, view.known[known]])
    return fit_predict(x_train, y_train, view.x, cfg.classifier, cfg.seed)


def _acc(pred: np.ndarray, view: TargetView) -> float | None:
    return accuracy(pred, view.labels) if view.labels is not None else None


def _ask_teachers(source: ReleaseSource, session_id: str, queries: np.ndarray) -> np.ndarray:
    """PATE labels for ``queries``, asked in chunks that fit the source's request limit (one
    request id per chunk; each chunk is charged for its own queries)."""
    from dpda.service.serde import MAX_REQUEST_BYTES

    rows = max(1, (MAX_REQUEST_BYTES // 2) // (8 * max(1, queries.shape[1])))
    parts = [
        source.query_teachers(session_id, j, queries[start : start + rows])
        for j, start in enumerate(range(0, queries.shape[0], rows))
    ]
    return np.concatenate(parts)


@dataclass
class _Session:
    """One open session of a job: what every stage needs (the releases are fitted against the
    target's own rows projected with the session's matrix)."""

    source: ReleaseSource
    view: TargetView
    terms: SessionTerms
    cfg: AdaptConfig
    info: SessionInfo
    xt_proj: np.ndarray
    compute: Compute = field(default_factory=Compute)
    metric: np.ndarray | None = None  # cost = metric: the released W (d′ × ℓ)
    # a source-space session: the target's own map from the release's space to the OT space
    space: LocalSpace | None = None
    # the handles of what the tasks share (the projected rows, each view), sent once
    _shared: dict[int, tuple[object, Any]] = field(default_factory=dict, repr=False)
    # the target-side potentials of the session's first fit onto every target row: a task
    # (or, once gathered, its value) every later fit takes as its warm start
    _warm: Any = field(default=None, repr=False)

    def _put(self, obj: object) -> Any:
        got = self._shared.get(id(obj))
        if got is None or got[0] is not obj:
            got = (obj, self.compute.put(obj))
            self._shared[id(obj)] = got
        return got[1]

    def submit(self, rel: BatchRelease, v: TargetView) -> _PendingFit:
        """Start the fit of one release (a task per piece, ``split_rows``); the points come from
        the release here, in the job's process; the plans are made where the tasks run."""
        cfg, q = self.cfg, self.info.n_classes
        if self.terms.release != "rows":
            synthetic = synthetic_params(self.terms)
            pts, ys, a = aggregate_points(
                rel, self.terms.release, q, cfg.seed, cfg.synthetic_per_class, synthetic
            )
            lifted = self.lift(pts)
            if self.space is not None:
                pts = self.space(pts)
            noise_std = 0.0
        else:
            n = rel.z.shape[0]
            pts, ys, a = rel.z, counts_to_labels(rel.noisy_counts, n), uniform(n)
            lifted = None
            assert isinstance(rel.spec, BatchSpec)  # a metric release is never fitted
            noise_std = rel.spec.features.noise_std
        rows: np.ndarray | None = None
        m = v.x.shape[0]
        if self.terms.release == "rows" and 0 < cfg.target_batch < m:
            rng = np.random.default_rng([cfg.seed, rel.index])
            rows = np.sort(rng.choice(m, cfg.target_batch, replace=False))
            m = cfg.target_batch
        xt, view = self._put(self.xt_proj), self._put(v)
        spans = split_rows(pts.shape[0], m, self.compute.max_cells())
        warm = None
        if cfg.warm_batches and rows is None and self._warm is not None:
            warm = self.compute.handle(self._warm)
        tasks = [
            self.compute.submit(
                fit_piece,
                pts[i:j],
                ys[i:j],
                a if len(spans) == 1 else a[i:j] / a[i:j].sum(),
                noise_std,
                xt,
                view,
                cfg,
                q,
                rows,
                self.metric,
                warm,
            )
            for i, j in spans
        ]
        if cfg.warm_batches and rows is None and self._warm is None:
            self._warm = self.compute.derive(warm_of, tasks[0])
        return _PendingFit(tasks, [float(a[i:j].sum()) for i, j in spans], a, lifted)

    def lift(self, pts: np.ndarray) -> np.ndarray:
        """Release points (the release's own space) → the target's space ``view.x``: the
        target's scaling of a source-space release; a projected release back through the
        basis (the component the projection keeps)."""
        if self.space is not None:
            return np.asarray(self.space.scaling.apply(pts))
        return np.asarray(pts @ np.linalg.pinv(self.info.projection))

    def collect(self, pending: list[_PendingFit]) -> list[BatchFit]:
        """The fits of ``pending``, in order (waits for their tasks)."""
        flat = self.compute.gather([t for p in pending for t in p.tasks])
        out, k = [], 0
        t = self.cfg.transport_step
        for p in pending:
            fit = combine(flat[k : k + len(p.tasks)], p.shares, p.weights)
            if p.lifted is not None and t != 1.0:
                fit = replace(fit, mapped=(1.0 - t) * p.lifted + t * fit.mapped)
            if self.space is not None:
                # into the OT space's span: the classifier then compares the target's rows
                # with them along the ℓ directions the target chose, not along the k − ℓ
                # others, where a source-space release holds only noise
                b = self.space.basis
                fit = replace(fit, mapped=(fit.mapped @ b) @ b.T)
            out.append(fit)
            k += len(p.tasks)
        return out

    def fit_all(self, rels: list[BatchRelease], v: TargetView) -> list[BatchFit]:
        return self.collect([self.submit(r, v) for r in rels])

    def fit(self, rel: BatchRelease, v: TargetView) -> BatchFit:
        return self.fit_all([rel], v)[0]


@dataclass(frozen=True)
class _PendingFit:
    tasks: list[Any]  # one per piece of the release's points
    shares: list[float]  # each piece's share of the release's mass
    weights: np.ndarray  # the release's point masses
    lifted: np.ndarray | None = None  # aggregate releases: the points in the target's space


def fit_piece(
    pts: np.ndarray,
    ys: np.ndarray,
    a: np.ndarray,
    noise_std: float,
    xt_proj: np.ndarray,
    view: TargetView,
    cfg: AdaptConfig,
    n_classes: int,
    rows: np.ndarray | None,
    metric: np.ndarray | None = None,
    warm: np.ndarray | None = None,
) -> BatchFit:
    """One task: ``fit_points`` onto the target's rows (``rows``: a subset of them), in the
    learned metric's space when there is one, warm-started from an earlier fit onto all of
    them (``warm``). A pure function of its arguments: the same result on any worker, in any
    order."""
    start = warm if rows is None else None
    if rows is not None:
        view = TargetView(view.x[rows], view.scaling, None, view.known[rows])
        xt_proj = xt_proj[rows]
    fit = fit_points(pts, ys, a, noise_std, xt_proj, view, cfg, n_classes, metric, start)
    return fit if rows is None else replace(fit, warm=None)


def warm_of(fit: BatchFit) -> np.ndarray | None:
    """A fit's target-side potentials (a small task: later fits take these, not the fit)."""
    return fit.warm


def combine(pieces: list[BatchFit], shares: list[float], weights: np.ndarray) -> BatchFit:
    """One release's fit from the fits of its pieces (contiguous spans of its points, each
    transported with its mass normalized to 1): images and labels in order; class masses
    weighted by each piece's share of the release's mass; each target row's back-mapped image
    the mass-weighted mean of the pieces' (the exact barycentre of the pieces' plans put
    together). One piece is returned as it is."""
    if len(pieces) == 1:
        return pieces[0]
    col = [s * f.class_mass.sum(axis=0) for f, s in zip(pieces, shares, strict=True)]
    total = np.maximum(np.sum(col, axis=0), 1e-300)[:, None]
    back = sum(c[:, None] * f.back_mapped for c, f in zip(col, pieces, strict=True)) / total
    return BatchFit(
        mapped=np.vstack([f.mapped for f in pieces]),
        labels=np.concatenate([f.labels for f in pieces]),
        w_tilde=float(sum(s * f.w_tilde for f, s in zip(pieces, shares, strict=True))),
        converged=all(f.converged for f in pieces),
        class_mass=np.sum([s * f.class_mass for f, s in zip(pieces, shares, strict=True)], axis=0),
        back_mapped=np.asarray(back),
        points=np.vstack([f.points for f in pieces]),
        weights=weights,
        kernel_builds=sum(f.kernel_builds for f in pieces),
        passes=sum(f.passes for f in pieces),
        bytes_read=sum(f.bytes_read for f in pieces),
        pass_bytes=sum(f.pass_bytes for f in pieces),
        seconds=sum(f.seconds for f in pieces),
        warm=pieces[0].warm,
    )


def session_terms(
    view: TargetView, terms: SessionTerms, cfg: AdaptConfig
) -> tuple[SessionTerms, np.ndarray | None]:
    """What the target decides from its own rows before it opens a session (and ``dpda target
    plan`` before anything is asked): the target-pca basis — at most as many directions as the
    target has features and rows; a larger ``projection_dim`` is lowered to that, and said —
    and, under the record unit, the clipping norm as a quantile of its projected rows."""
    most = min(view.x.shape)
    if terms.source_space:  # nothing of the target is sent; C is a public bound
        terms = terms.model_copy(
            update={
                "projection_dim": min(terms.projection_dim, most),
                "clip_norm": natural_clip(view.representation, terms.clip_norm),
            }
        )
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
        update: dict[str, Any] = {"projection_dim": most}
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


def _open(
    source: ReleaseSource,
    view: TargetView,
    terms: SessionTerms,
    cfg: AdaptConfig,
    compute: Compute | None = None,
) -> _Session:
    terms, basis = session_terms(view, terms, cfg)
    if terms.source_space:
        info = source.open_session(terms, TargetDisclosure(None, None))
        if info.projection.shape[0] != view.x.shape[1]:
            raise PeerMisbehaved(
                f"the source has {info.projection.shape[0]} features, the target {view.x.shape[1]}"
            )
        space, xt_proj = local_space(view, terms.clip_norm, terms.projection_dim)
        return _Session(source, view, terms, cfg, info, xt_proj, compute or Compute(), space=space)
    info = source.open_session(terms, TargetDisclosure(view.scaling, basis))
    xt_proj = view.x @ info.projection
    return _Session(source, view, terms, cfg, info, xt_proj, compute or Compute())


@dataclass
class _Fitted:
    """The releases of a session, their fits, and what the classifier made of them."""

    releases: list[BatchRelease] = field(default_factory=list)
    fits: list[BatchFit] = field(default_factory=list)
    counts: list[list[int]] = field(default_factory=list)
    spend: list[float] = field(default_factory=list)
    release_seconds: float = 0.0  # wall time spent waiting for the source's releases
    mapped: np.ndarray | None = None
    mapped_labels: np.ndarray | None = None
    model: object = None
    pred: np.ndarray | None = None
    aggregate: bool = False  # class points (an aggregate release), not rows

    def train(self, view: TargetView, cfg: AdaptConfig) -> None:
        self.mapped = np.vstack([f.mapped for f in self.fits])
        self.mapped_labels = np.concatenate([f.labels for f in self.fits])
        if self.aggregate:
            self.mapped = self_label_step(self.mapped, view.x, cfg.refine)
        self.model, self.pred = _train(view, self.mapped, self.mapped_labels, cfg)


def self_label_step(points: np.ndarray, x: np.ndarray, step: float) -> np.ndarray:
    """One self-labelling step on the target's own rows ``x``: each point moves ``step`` of
    the way towards the mean of the rows it is nearest to (those its 1-NN classifier labels);
    a point nearest to no row stays. Post-processing: no budget."""
    if step == 0.0 or points.shape[0] == 0 or x.shape[0] == 0:
        return points
    from sklearn.metrics import pairwise_distances_argmin

    near = pairwise_distances_argmin(x, points)
    sums = np.zeros_like(points, dtype=float)
    np.add.at(sums, near, x)
    count = np.bincount(near, minlength=points.shape[0])
    hit = count > 0
    out = np.array(points, dtype=float)
    out[hit] = (1.0 - step) * out[hit] + step * sums[hit] / count[hit, None]
    return out


def _release_all(
    s: _Session, spent: Callable[[], float], progress: Callable[[int, int], None] | None
) -> _Fitted:
    out = _Fitted(aggregate=s.terms.release != "rows")
    steps = s.info.plan.steps
    pending: list[_PendingFit] = []
    if s.info.plan.is_metric(steps):  # the learned cost first: every fit below uses it
        t0 = time.perf_counter()
        s.metric = s.source.release(s.info.session_id, steps).z
        out.release_seconds += time.perf_counter() - t0
        out.spend.append(spent())
    for i in range(steps):
        t0 = time.perf_counter()
        rel = s.source.release(s.info.session_id, i)
        out.release_seconds += time.perf_counter() - t0
        out.releases.append(rel)
        # in-process: fitted now; on Dask: a task, while this process asks for the next release
        pending.append(s.submit(rel, s.view))
        out.counts.append([int(c) for c in rel.noisy_counts])
        if i + 1 < steps:  # the last one is read after training: its charge check and
            out.spend.append(spent())  # countersignature run meanwhile, in the background
        if progress:
            progress(i + 1, steps)
    out.fits = s.collect(pending)
    return out


def _query_variances(s: _Session, rq: RowQueries) -> np.ndarray:
    """The variances of the projected target rows along each direction, for synthetic queries,
    from released or public values only: the DP ones of the disclosure; else (a JL projection,
    or exact disclosures, which do not send the eigenvalues) the unit variance of the scaled
    columns through the public projection."""
    ell = s.xt_proj.shape[1]
    if rq.variances is not None and rq.variances.size >= ell:
        return np.asarray(rq.variances[:ell])
    return np.asarray(np.sum(s.info.projection**2, axis=0))


def _pate_labels(s: _Session, idx: np.ndarray, rq: RowQueries, seed: int) -> np.ndarray:
    """Labels for the target rows ``idx`` under the target's row-query policy ``rq``."""
    space = s.xt_proj if s.terms.pate_space == "projected" else s.view.x
    sid = s.info.session_id
    if rq.mode == "exact":
        return _ask_teachers(s.source, sid, np.ascontiguousarray(space[idx]))
    if s.terms.pate_space != "projected":
        raise ConfigError(f"privacy.row_queries: {rq.mode} queries are projected; pate_space raw")
    if rq.mode == "dp":
        if rq.protect is None:
            raise ConfigError("privacy.row_queries: dp needs the target's own ledger")
        sent = rq.protect(sid, np.ascontiguousarray(space[idx]), float(s.terms.clip_norm))
        return _ask_teachers(s.source, sid, np.ascontiguousarray(sent))
    if rq.mode == "synthetic":
        from dpda.dp.target_disclosure import synthetic_points

        pts = synthetic_points(_query_variances(s, rq), idx.size, np.random.default_rng([seed, 7]))
        if rq.record is not None:
            pts = rq.record(sid, pts)
        answers = _ask_teachers(s.source, sid, np.ascontiguousarray(pts))
        _, pred = fit_predict(pts, answers, space, s.cfg.classifier, seed)
        return np.asarray(pred, dtype=np.int64)[idx]
    raise ConfigError(f"privacy.row_queries: {rq.mode!r} is not exact, dp or synthetic")


def _pate(s: _Session, done: _Fitted, by_method: dict[str, float | None], rq: RowQueries) -> None:
    """Label ``pate_queries`` target rows through the teachers, as ``rq`` allows; with DPDA,
    re-fit the same releases with those labels as known (post-processing), else train a student
    on them. Under ``dp`` the rows are drawn at random (a choice by the plan would depend on
    every target row); otherwise the plan picks them (``cfg.pate_select``)."""
    view, cfg, terms, fits = s.view, s.cfg, s.terms, done.fits
    n_q = s.info.plan.pate_queries
    if fits and rq.mode != "dp":
        mass = np.sum([f.class_mass for f in fits], axis=0)
        idx = select_rows(mass, n_q, cfg.pate_select, cfg.seed)
    else:
        idx = np.random.default_rng(cfg.seed).choice(view.x.shape[0], n_q, replace=False)
    if (
        fits
        and rq.mode == "exact"
        and cfg.pate_query == "backmapped"
        and terms.pate_space == "projected"
    ):
        queries = (np.sum([f.back_mapped for f in fits], axis=0) / len(fits))[idx]
        labels = _ask_teachers(s.source, s.info.session_id, np.ascontiguousarray(queries))
    else:
        labels = _pate_labels(s, idx, rq, cfg.seed)
    known = view.known.copy()
    if fits and cfg.pate_agree:
        plan_class = np.argmax(sum(f.class_mass for f in fits), axis=0)[idx]
        keep = labels == plan_class
        idx, labels = idx[keep], labels[keep]
    known[idx] = labels
    labeled = TargetView(view.x, view.scaling, view.labels, known, view.disclosure)
    if fits:
        done.fits = s.fit_all(done.releases, labeled)
        done.train(labeled, cfg)
        by_method["dpda_pate"] = _acc(done.pred, view) if done.pred is not None else None
    elif idx.size:
        done.model, done.pred = fit_predict(view.x[idx], labels, view.x, cfg.classifier, cfg.seed)
        by_method["pate"] = _acc(done.pred, view)


def run_dpda(
    source: ReleaseSource,
    view: TargetView,
    terms: SessionTerms,
    cfg: AdaptConfig,
    spent: Callable[[], float],
    progress: Callable[[int, int], None] | None = None,
    row_queries: RowQueries | None = None,
    compute: Compute | None = None,
) -> DPDAResult:
    """Run one job against ``source``; ``spent()`` reads ε from the target's ledger;
    ``row_queries``: what PATE may send about the target's rows.

    DPDA releases (``terms.dpda``) → OT → mapped source rows. With PATE (``terms.pate_queries``):
    alone, the teachers label random target rows and a student is trained on them; with DPDA,
    they label the target rows least certain under the plan, which then forbid mass from source
    rows of other classes in a second solve on the *same* releases (post-processing, no budget).
    """
    if cfg.target_batch and terms.pate_queries:  # checked before anything is spent
        raise ConfigError("target_batch: target-side minibatches are not combined with PATE yet")
    timed = _TimedSource(source, spent)
    source, spent = timed, timed.spent
    s = _open(source, view, terms, cfg, compute)
    done = _release_all(s, spent, progress)
    by_method: dict[str, float | None] = {}
    selection: dict[str, Any] = {}
    adaptation: dict[str, Any] = {}
    if done.fits:
        selection = select(s, done, view)  # may change s.cfg and done.fits
        done.train(view, s.cfg)
        by_method["dpda"] = _acc(done.pred, view) if done.pred is not None else None
        adaptation = _without_adaptation(s, done, by_method)
        done.spend.append(spent())  # before any PATE answer is charged
    if s.info.plan.pate_queries > 0:
        _pate(s, done, by_method, row_queries or RowQueries())
    source.close_session(s.info.session_id)
    out = _result(s, done, by_method, spent(), selection)
    return replace(out, source_seconds=timed.seconds, adaptation=adaptation)


def _without_adaptation(s: _Session, done: _Fitted, by_method: dict[str, float | None]) -> dict:
    """The same release used without adaptation: a nearest-class-mean classifier whose class
    means are the release's own (in the OT space, then lifted into the target's space so the
    saved model reads raw rows), next to DPDA; both scored by the label-free cluster estimate
    (``selection.cluster_score``). With ``keep = "better"`` the job keeps the one the estimate
    prefers. Post-processing of one release: no budget."""
    from sklearn.neighbors import KNeighborsClassifier

    from dpda.target_party.selection import cluster_score

    pts = np.vstack([f.points for f in done.fits])
    labels = np.concatenate([f.labels for f in done.fits])
    w = np.concatenate([f.weights for f in done.fits])
    width = s.xt_proj.shape[1]
    pts = pts[:, :width]
    classes = np.unique(labels)
    means = np.vstack(
        [np.average(pts[labels == c], axis=0, weights=w[labels == c] + 1e-300) for c in classes]
    )
    to_ot = s.space.basis if s.space is not None else s.info.projection
    centres = means @ np.linalg.pinv(to_ot)
    model = KNeighborsClassifier(n_neighbors=1).fit(centres, classes)
    pred = np.asarray(model.predict(s.view.x))
    by_method["dp_no_adaptation"] = _acc(pred, s.view)
    assert done.pred is not None
    scores = {
        "dpda": cluster_score(s.xt_proj, done.pred, s.cfg.seed),
        "dp_no_adaptation": cluster_score(s.xt_proj, pred, s.cfg.seed),
    }
    kept = "dpda"
    if s.cfg.keep == "better" and scores["dp_no_adaptation"] > scores["dpda"]:
        kept = "dp_no_adaptation"
        done.model, done.pred = model, pred
    agree = float(np.mean(pred == done.pred)) if kept == "dpda" else 1.0
    return {
        "estimate": scores,
        "estimate_method": "silhouette",
        "kept": kept,
        "kept_accuracy": by_method.get(kept),
        "rule": s.cfg.keep,
        "agreement": agree,
        "predictions": pred,
    }


class _TimedSource:
    """The job's source, the wall time of each call summed (``DPDAResult.source_seconds``):
    what the job spends on the source — asking it, and through ``spent`` waiting for its
    charges to be checked. The rest of a job is the target's own compute, the same
    arithmetic in-process and through the daemons (``dpda bench service`` reports the two
    apart; in-process, the rest also holds setting up the view and the releaser)."""

    def __init__(self, source: ReleaseSource, spent: Callable[[], float]) -> None:
        self.inner, self._spent, self.seconds = source, spent, 0.0

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0

    def open_session(
        self, terms: SessionTerms, disclosure: TargetDisclosure, session_id: str | None = None
    ) -> SessionInfo:
        return self._timed(self.inner.open_session, terms, disclosure, session_id)

    def release(self, session_id: str, index: int, peer: str | None = None) -> BatchRelease:
        if peer is None:  # each source's own default
            return self._timed(self.inner.release, session_id, index)
        return self._timed(self.inner.release, session_id, index, peer)

    def query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray:
        return self._timed(self.inner.query_teachers, session_id, index, queries)

    def close_session(self, session_id: str) -> None:
        self._timed(self.inner.close_session, session_id)

    def spent(self) -> float:
        return float(self._timed(self._spent))


def _result(
    s: _Session,
    done: _Fitted,
    by_method: dict[str, float | None],
    epsilon_spent: float,
    selection: dict[str, Any],
) -> DPDAResult:
    view, fits = s.view, done.fits
    pred = done.pred if done.pred is not None else np.zeros(view.x.shape[0], dtype=np.int64)
    spec = s.info.plan.spec(s.terms)
    return DPDAResult(
        accuracy=_acc(pred, view),
        epsilon_spent=epsilon_spent,
        delta=s.terms.delta,
        noise_multiplier=spec.features.noise_multiplier,
        noise_std=spec.features.noise_std,
        projection_dim=s.xt_proj.shape[1],
        n_batches=s.info.plan.steps,
        rows_received=int(sum(r.z.shape[0] for r in done.releases)),
        w_tilde=float(np.mean([f.w_tilde for f in fits])) if fits else float("nan"),
        solver_converged=all(f.converged for f in fits),
        predictions=pred,
        mapped=done.mapped if done.mapped is not None else np.zeros((0, view.x.shape[1])),
        mapped_labels=(
            done.mapped_labels if done.mapped_labels is not None else np.zeros(0, dtype=np.int64)
        ),
        noisy_counts=done.counts,
        batch_spend=done.spend,
        release_seconds=done.release_seconds,
        source_points=(
            np.vstack([f.points for f in fits]) if fits else np.zeros((0, s.xt_proj.shape[1]))
        ),
        source_point_labels=(
            np.concatenate([f.labels for f in fits]) if fits else np.zeros(0, dtype=np.int64)
        ),
        target_projected=s.xt_proj,
        accuracy_by_method=by_method,
        pate_queries=s.info.plan.pate_queries,
        model=done.model,
        terms=s.terms,
        session_id=s.info.session_id,
        selection=selection,
        fit_traffic=FitTraffic.of(fits),
    )
