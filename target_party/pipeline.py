"""The DPDA job on the target: releases → debiased cost → entropic + group-lasso OT →
barycentric images in the target's own space → a local classifier.

The job takes *a source of releases* behind one small interface (``ReleaseSource``) with two
implementations: the in-process ``SourceReleaser`` and the gRPC client. Everything it computes
from releases is post-processing and costs no budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling, per_row
from dpda.dp.mechanisms import counts_to_labels
from dpda.errors import ConfigError
from dpda.ot.costs import dpot_cost, label_mask
from dpda.ot.mapping import barycentric_map
from dpda.ot.solvers import one_hot, sinkhorn_group_lasso, uniform
from dpda.protocol import BatchRelease, ReleaseSource, TargetDisclosure
from dpda.target_party.training import accuracy, fit_predict
from dpda.terms import SessionTerms


@dataclass(frozen=True)
class AdaptConfig:
    reg_e: float = 0.02  # entropic strength on the max-normalized cost
    reg_g: float = 0.5  # group-lasso strength
    outer_iter: int = 10
    inner_iter: int = 200
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


@dataclass(frozen=True)
class TargetView:
    """The target's data in its own representation (its raw feature space for mapping)."""

    x: np.ndarray  # (m, d) preprocessed target features
    scaling: Scaling
    labels: np.ndarray | None  # evaluation labels, if any
    known: np.ndarray  # (m,) −1 or a label the target knows (semi-supervised)


def target_view(
    target: Domain,
    representation: str,
    known: np.ndarray | None = None,
    scaling_mode: str = "zscore",
) -> TargetView:
    rep = per_row(target.x, representation)
    scaling = Scaling.of(rep, scaling_mode)
    kn = np.full(rep.shape[0], -1, dtype=np.int64) if known is None else known
    return TargetView(scaling.apply(rep), scaling, target.y, kn)


def target_pca_basis(x: np.ndarray, ell: int) -> np.ndarray:
    """Top-ℓ right singular vectors of the centred target data: (d, ℓ), orthonormal columns."""
    xc = x - x.mean(axis=0)
    _, _, vt = np.linalg.svd(xc, full_matrices=False)
    return np.ascontiguousarray(vt[:ell].T)


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


@dataclass(frozen=True)
class BatchFit:
    mapped: np.ndarray  # (n, d) in the target's space
    labels: np.ndarray  # (n,) from the noisy counts
    w_tilde: float
    converged: bool
    class_mass: np.ndarray  # (q, m): mass each class sends to each target row
    back_mapped: np.ndarray  # (m, ℓ): each target row's image among the noisy source rows


def fit_points(
    pts: np.ndarray,
    ys: np.ndarray,
    a: np.ndarray,
    noise_std: float,
    xt_proj: np.ndarray,
    view: TargetView,
    cfg: AdaptConfig,
    n_classes: int,
) -> BatchFit:
    """Labeled source points (noisy rows, prototypes or synthetic points) with weights ``a``
    → debiased cost → entropic + group-lasso OT → images in the target's own space."""
    mask = label_mask(ys, view.known) if np.any(view.known >= 0) else None
    cost = dpot_cost(pts, xt_proj, noise_std, mask)
    res = sinkhorn_group_lasso(
        a,
        uniform(xt_proj.shape[0]),
        cost.normalized,
        ys,
        cfg.reg_e,
        cfg.reg_g,
        outer_iter=cfg.outer_iter,
        inner_iter=cfg.inner_iter,
    )
    return BatchFit(
        mapped=barycentric_map(res.plan, view.x),
        labels=ys,
        w_tilde=cost.value(res.plan),
        converged=res.converged,
        class_mass=one_hot(ys, n_classes).astype(res.plan.dtype).T @ res.plan,
        back_mapped=barycentric_map(res.plan.T, pts),
    )


def adapt_batch(
    rel: BatchRelease, xt_proj: np.ndarray, view: TargetView, cfg: AdaptConfig, n_classes: int
) -> BatchFit:
    """One row release (Algorithm 2): labels from the noisy counts, uniform weights."""
    n = rel.z.shape[0]
    ys = counts_to_labels(rel.noisy_counts, n)
    return fit_points(
        rel.z, ys, uniform(n), rel.spec.features.noise_std, xt_proj, view, cfg, n_classes
    )


def aggregate_points(
    rel: BatchRelease, release: str, n_classes: int, seed: int, per_class: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Noisy class aggregates → (points (p, ℓ), labels (p,), weights (p,)), post-processing.

    ``prototypes``: one mean per class, weighted by its noisy count. ``class-gaussians``: points
    drawn from a diagonal Gaussian per class (noisy mean and variance), equal weights.
    """
    counts = np.asarray(rel.noisy_counts, dtype=float)
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


def adapt_aggregate(
    rel: BatchRelease,
    xt_proj: np.ndarray,
    view: TargetView,
    cfg: AdaptConfig,
    n_classes: int,
    release: str,
) -> BatchFit:
    """One aggregate release: weighted prototypes or synthetic points per class."""
    pts, ys, a = aggregate_points(rel, release, n_classes, cfg.seed, cfg.synthetic_per_class)
    return fit_points(pts, ys, a, 0.0, xt_proj, view, cfg, n_classes)


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


def run_dpda(
    source: ReleaseSource,
    view: TargetView,
    terms: SessionTerms,
    cfg: AdaptConfig,
    spent: Callable[[], float],
    progress: Callable[[int, int], None] | None = None,
) -> DPDAResult:
    """Run one job against ``source``; ``spent()`` reads ε from the target's ledger.

    DPDA releases (``terms.dpda``) → OT → mapped source rows. With PATE (``terms.pate_queries``):
    alone, the teachers label random target rows and a student is trained on them; with DPDA,
    they label the target rows least certain under the plan, which then forbid mass from source
    rows of other classes in a second solve on the *same* releases (post-processing, no budget).
    """
    if cfg.target_batch and terms.pate_queries:  # checked before anything is spent
        raise ConfigError("target_batch: target-side minibatches are not combined with PATE yet")
    basis = (
        target_pca_basis(view.x, terms.projection_dim) if terms.projection == "target-pca" else None
    )
    if terms.privacy_unit == "record" and cfg.clip_quantile > 0 and basis is not None:
        norms = np.linalg.norm(view.x @ basis, axis=1)
        terms = terms.model_copy(update={"clip_norm": float(np.quantile(norms, cfg.clip_quantile))})
    info = source.open_session(terms, TargetDisclosure(view.scaling, basis))

    def fit(rel: BatchRelease, v: TargetView) -> BatchFit:
        if terms.release == "rows":
            if 0 < cfg.target_batch < v.x.shape[0]:
                rng = np.random.default_rng([cfg.seed, rel.index])
                idx = np.sort(rng.choice(v.x.shape[0], cfg.target_batch, replace=False))
                sub = TargetView(v.x[idx], v.scaling, None, v.known[idx])
                return adapt_batch(rel, xt_proj[idx], sub, cfg, q)
            return adapt_batch(rel, xt_proj, v, cfg, q)
        return adapt_aggregate(rel, xt_proj, v, cfg, q, terms.release)

    xt_proj = view.x @ info.projection
    q = info.n_classes
    releases: list[BatchRelease] = []
    fits: list[BatchFit] = []
    counts, spend = [], []
    for i in range(info.plan.steps):
        rel = source.release(info.session_id, i)
        releases.append(rel)
        fits.append(fit(rel, view))
        counts.append([int(c) for c in rel.noisy_counts])
        if i + 1 < info.plan.steps:  # the last one is read after training: its charge check
            spend.append(spent())  # and countersignature run meanwhile, in the background
        if progress:
            progress(i + 1, info.plan.steps)
    by_method: dict[str, float | None] = {}
    mapped = np.zeros((0, view.x.shape[1]))
    mapped_labels = np.zeros(0, dtype=np.int64)
    pred = np.zeros(view.x.shape[0], dtype=np.int64)
    model: object = None
    if fits:
        mapped = np.vstack([f.mapped for f in fits])
        mapped_labels = np.concatenate([f.labels for f in fits])
        model, pred = _train(view, mapped, mapped_labels, cfg)
        by_method["dpda"] = _acc(pred, view)
        spend.append(spent())  # before any PATE answer is charged
    n_q = info.plan.pate_queries
    if n_q > 0:
        space = xt_proj if terms.pate_space == "projected" else view.x
        if fits:
            mass = np.sum([f.class_mass for f in fits], axis=0)
            idx = select_rows(mass, n_q, cfg.pate_select, cfg.seed)
            queries = space[idx]
            if cfg.pate_query == "backmapped" and terms.pate_space == "projected":
                queries = (np.sum([f.back_mapped for f in fits], axis=0) / len(fits))[idx]
        else:
            idx = np.random.default_rng(cfg.seed).choice(view.x.shape[0], n_q, replace=False)
            queries = space[idx]
        labels = _ask_teachers(source, info.session_id, np.ascontiguousarray(queries))
        known = view.known.copy()
        if fits and cfg.pate_agree:
            plan_class = np.argmax(sum(f.class_mass for f in fits), axis=0)[idx]
            keep = labels == plan_class
            idx, labels = idx[keep], labels[keep]
        known[idx] = labels
        labeled = TargetView(view.x, view.scaling, view.labels, known)
        if fits:
            fits = [fit(r, labeled) for r in releases]
            mapped = np.vstack([f.mapped for f in fits])
            mapped_labels = np.concatenate([f.labels for f in fits])
            model, pred = _train(labeled, mapped, mapped_labels, cfg)
            by_method["dpda_pate"] = _acc(pred, view)
        else:
            model, pred = fit_predict(view.x[idx], labels, view.x, cfg.classifier, cfg.seed)
            by_method["pate"] = _acc(pred, view)
    source.close_session(info.session_id)
    spec = info.plan.spec(terms)
    return DPDAResult(
        accuracy=_acc(pred, view),
        epsilon_spent=spent(),
        delta=terms.delta,
        noise_multiplier=spec.features.noise_multiplier,
        noise_std=spec.features.noise_std,
        projection_dim=info.projection.shape[1],
        n_batches=info.plan.steps,
        rows_received=int(sum(r.z.shape[0] for r in releases)),
        w_tilde=float(np.mean([f.w_tilde for f in fits])) if fits else float("nan"),
        solver_converged=all(f.converged for f in fits),
        predictions=pred,
        mapped=mapped,
        mapped_labels=mapped_labels,
        noisy_counts=counts,
        batch_spend=spend,
        accuracy_by_method=by_method,
        pate_queries=n_q,
        model=model,
        terms=terms,
    )
