"""Fitting releases onto the target's rows: the points a release carries (noisy rows, class
aggregates) → debiased cost → entropic + group-lasso OT → images in the target's own space,
split into tasks that run in-process or on Dask workers (``JobSession``), then the classifier
trained on the images (``Fitted``). Everything here is post-processing: no budget."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dpda.dp.events import BatchSpec
from dpda.dp.mechanisms import counts_to_labels
from dpda.dp.sinkhorn_synthetic import SinkhornSyntheticParams, synthetic_labels
from dpda.ot.costs import dpot_cost, label_mask
from dpda.ot.fast import SinkhornState, Workspace
from dpda.ot.mapping import barycentric_map
from dpda.ot.solvers import OTResult, one_hot, sinkhorn_group_lasso, uniform
from dpda.ot.traffic import Traffic
from dpda.protocol import BatchRelease, ReleaseSource, SessionInfo
from dpda.target_party.compute import Compute, split_rows
from dpda.target_party.training import ROW_CLASSIFIERS, accuracy, fit_on_rows, fit_predict
from dpda.target_party.view import AdaptConfig, LocalSpace, TargetView
from dpda.terms import CELL_NOISE_SHARE, SessionTerms, synthetic_params


@dataclass(frozen=True)
class BatchFit:
    mapped: np.ndarray  # (n, d) in the target's space
    labels: np.ndarray  # (n,) from the noisy counts
    w_tilde: float
    converged: bool
    class_mass: np.ndarray  # (q, m): mass each class sends to each target row
    # (m, ℓ): each target row's image among the noisy source rows; only a session with PATE
    # queries asks for it (None otherwise)
    back_mapped: np.ndarray | None
    points: np.ndarray  # (n, ℓ) the source points transported (noisy rows, prototypes, …)
    weights: np.ndarray  # (n,) their masses
    # what the fit read (the solver's passes plus the cost's normalization and the three
    # products with the plan: images, class masses, back-mapped rows), and its own time
    traffic: Traffic = Traffic()
    # target-side potentials of the first entropic solve, in the raw cost's units (the warm
    # start of a later batch's fit); None when the fit covers a subset of the target's rows
    warm: np.ndarray | None = None


_LOCAL = threading.local()


def _workspace() -> Workspace:
    """This thread's solver buffers, reused by its next fit (a batch's cost and plan are a few
    hundred MB at VisDA scale; fresh ones cost their page faults every batch)."""
    ws: Workspace | None = getattr(_LOCAL, "workspace", None)
    if ws is None:
        ws = _LOCAL.workspace = Workspace()
    return ws


def release_workspace() -> None:
    """Drop this thread's solver buffers (a job calls it when its fits are done)."""
    _LOCAL.workspace = None


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
    back_map: bool = True,
) -> BatchFit:
    """Labeled source points (noisy rows, prototypes or synthetic points) with weights ``a``
    → debiased cost → entropic + group-lasso OT → images in the target's own space.

    ``metric``: the session's learned W (``d′ × ℓ``): the cost is ``‖W(z_s − z_t)‖²`` (both
    sides mapped by W, then squared Euclidean; the noise bias becomes ``σ²‖W‖_F²``); the plan
    still maps the source onto the target's own rows. ``warm``: an earlier fit's ``warm`` onto
    the same target rows (the first Sinkhorn solve starts from it; the plan does not depend
    on it beyond the solver's tolerance). A pure function of its arguments; the cost and the
    plan live in this thread's workspace (``_workspace``) and do not outlive the call."""
    t0 = time.perf_counter()
    ws = _workspace()
    m = xt_proj.shape[0]
    buf = ws.array("cost", (pts.shape[0], m), np.float32)
    mask = label_mask(ys, view.known) if np.any(view.known >= 0) else None
    if metric is None:
        cost = dpot_cost(pts, xt_proj, noise_std, mask, out=buf)
    else:
        std = noise_std * float(np.linalg.norm(metric)) / np.sqrt(metric.shape[0])
        cost = dpot_cost(pts @ metric.T, xt_proj @ metric.T, std, mask, out=buf)
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
        **solve_effort(cfg, pts.shape[0] * m),
        inner_iter=cfg.inner_iter,
        stop_thr=cfg.outer_tol,
        start=start,
        workspace=ws,
    )
    plan = res.plan
    mass = float(a.sum())
    out = res.start_state
    return BatchFit(
        mapped=barycentric_map(plan, view.x32 if plan.dtype == np.float32 else view.x, res.rows),
        labels=ys,
        # W̃ = ⟨γ, C̃⟩ from the solver's own ⟨γ, C/scale⟩ (no further pass over the plan)
        w_tilde=cost.scale * res.transport_cost - cost.bias * mass,
        converged=res.converged,
        class_mass=_class_mass(res, ys, n_classes),
        back_mapped=barycentric_map(plan.T, pts, res.cols) if back_map else None,
        points=pts,
        weights=a,
        # + the cost's normalization (its maximum, then the division) and the products with
        # the plan: the two maps, and Yᵀγ where the solver did not sum it
        traffic=res.traffic
        + Traffic(
            bytes_read=2 * cost.normalized.nbytes
            + (1 + back_map + (res.class_mass is None)) * plan.nbytes,
            pass_bytes=res.traffic.passes * plan.nbytes,
            fits=1,
            seconds=time.perf_counter() - t0,
        ),
        warm=None if out is None else out.beta * cost.scale,
    )


# A fit whose plan holds more than LARGE_PLAN entries (a minibatch against every row of a large
# target) reads hundreds of MB a pass, so it takes at most LARGE_OUTER_ITER conditional-gradient
# steps and stops each inner solve at the plan's own tolerance (1e-3, the bound under which it
# still reports converged); what that costs the every-row VisDA job in accuracy, and saves in
# passes: docs/results.md, "Speed". Smaller plans (every Office-Caltech and digits job) solve
# as before.
LARGE_PLAN = 30_000_000
LARGE_OUTER_ITER = 4
LARGE_INNER_TOL = 1e-3


def solve_effort(cfg: AdaptConfig, cells: int) -> dict[str, Any]:
    """The outer steps and inner tolerance of one fit of ``cells`` plan entries."""
    if cells > LARGE_PLAN:
        return {
            "outer_iter": min(cfg.outer_iter, LARGE_OUTER_ITER),
            "inner_tol": max(cfg.inner_tol, LARGE_INNER_TOL),
        }
    return {"outer_iter": cfg.outer_iter, "inner_tol": cfg.inner_tol}


def _class_mass(res: OTResult, ys: np.ndarray, n_classes: int) -> np.ndarray:
    """``Yᵀγ (n_classes, m)``: the solver's own sums when it made them, else one product."""
    if res.class_mass is None:
        return one_hot(ys, n_classes).astype(res.plan.dtype).T @ res.plan
    out = np.zeros((n_classes, res.class_mass.shape[1]))
    out[: res.class_mass.shape[0]] = res.class_mass
    return out


def aggregate_points(
    rel: BatchRelease,
    release: str,
    n_classes: int,
    seed: int,
    per_class: int,
    synthetic: SinkhornSyntheticParams | None = None,
    clip_norm: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Noisy class aggregates → (points (p, ℓ), labels (p,), weights (p,)), post-processing.

    ``prototypes``: one mean per class (or per kept cell, ``cell_points``), weighted by its
    noisy count. ``class-gaussians``: points drawn from a diagonal Gaussian per class (noisy
    mean and variance), equal weights.
    ``sinkhorn-synthetic``: the released points as they are, each class's mass its noisy count
    shared equally by its points.
    """
    counts = np.asarray(rel.noisy_counts, dtype=float)
    if release == "sinkhorn-synthetic":
        if synthetic is None:
            raise ValueError("sinkhorn-synthetic points need the session's parameters")
        labels = synthetic_labels(
            rel.noisy_counts, synthetic.synthetic_points, synthetic.rows_per_point
        )
        share = counts.clip(1.0)[labels]
        share = share / np.bincount(labels, minlength=n_classes)[labels]
        return rel.z, labels, share / share.sum()
    ell = rel.z.shape[1] if release == "prototypes" else rel.z.shape[1] // 2
    if release == "prototypes" and counts.size > n_classes:
        return cell_points(rel, n_classes, clip_norm)
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


def cell_points(
    rel: BatchRelease, n_classes: int, clip_norm: float
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-(class, cell) noisy sums and counts (``cells``) → (points, labels, weights).

    A cell whose noisy count n̂ makes its mean's noise, σ·√ℓ / n̂ (σ the release's per-coordinate
    noise, rows clipped to C), larger than ``CELL_NOISE_SHARE``·C is not a point of its own: the
    class's small cells are summed into one mean (and, when no cell is large enough, so is the
    whole class). Each point weighs its noisy count; a class whose noisy total is below one is
    left out, as a class is in the per-class release. Post-processing of the one release.
    """
    counts = np.asarray(rel.noisy_counts, dtype=float).reshape(n_classes, -1)
    sums = np.asarray(rel.z, dtype=float).reshape(n_classes, counts.shape[1], -1)
    ell = sums.shape[2]
    spec = rel.spec
    std = spec.features.noise_std if isinstance(spec, BatchSpec) else 0.0
    least = max(std * np.sqrt(ell) / (CELL_NOISE_SHARE * clip_norm), 1.0)
    pts, labels, weights = [], [], []
    for k in range(n_classes):
        big = counts[k] >= least
        for g in [*np.flatnonzero(big)[:, None], np.flatnonzero(~big)]:
            n = float(counts[k, g].sum())
            if g.size == 0 or n < 1.0:
                continue
            pts.append(sums[k, g].sum(axis=0) / n)
            labels.append(k)
            weights.append(n)
    if not pts:  # no class with a count of one: every class's mean, equal weights
        n = np.maximum(counts.sum(axis=1), 1.0)[:, None]
        return sums.sum(axis=1) / n, np.arange(n_classes), np.full(n_classes, 1.0 / n_classes)
    w = np.asarray(weights)
    return np.vstack(pts), np.asarray(labels, dtype=np.int64), w / w.sum()


@dataclass
class JobSession:
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

    def submit(self, rel: BatchRelease, v: TargetView) -> PendingFit:
        """Start the fit of one release (a task per piece, ``split_rows``); the points come from
        the release here, in the job's process; the plans are made where the tasks run."""
        cfg, q = self.cfg, self.info.n_classes
        if self.terms.release != "rows":
            synthetic = synthetic_params(self.terms)
            pts, ys, a = aggregate_points(
                rel,
                self.terms.release,
                q,
                cfg.seed,
                cfg.synthetic_per_class,
                synthetic,
                self.terms.clip_norm,
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
                self.terms.pate_queries > 0,  # the back-maps serve PATE's queries only
            )
            for i, j in spans
        ]
        if cfg.warm_batches and rows is None and self._warm is None:
            self._warm = self.compute.derive(warm_of, tasks[0])
        return PendingFit(tasks, [float(a[i:j].sum()) for i, j in spans], a, lifted)

    def lift(self, pts: np.ndarray) -> np.ndarray:
        """Release points (the release's own space) → the target's space ``view.x``: the
        target's scaling of a source-space release; a projected release back through the
        basis (the component the projection keeps)."""
        if self.space is not None:
            return np.asarray(self.space.scaling.apply(pts))
        return np.asarray(pts @ np.linalg.pinv(self.info.projection))

    def collect(self, pending: list[PendingFit]) -> list[BatchFit]:
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
class PendingFit:
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
    back_map: bool = True,
) -> BatchFit:
    """One task: ``fit_points`` onto the target's rows (``rows``: a subset of them), in the
    learned metric's space when there is one, warm-started from an earlier fit onto all of
    them (``warm``); ``back_map``: also each target row's image among the points (PATE's
    queries). A pure function of its arguments: the same result on any worker, in any order."""
    start = warm if rows is None else None
    if rows is not None:
        view = TargetView(view.x[rows], view.scaling, None, view.known[rows])
        xt_proj = xt_proj[rows]
    fit = fit_points(pts, ys, a, noise_std, xt_proj, view, cfg, n_classes, metric, start, back_map)
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
    back = None
    if all(f.back_mapped is not None for f in pieces):
        back = np.asarray(
            sum(c[:, None] * f.back_mapped for c, f in zip(col, pieces, strict=True)) / total
        )
    return BatchFit(
        mapped=np.vstack([f.mapped for f in pieces]),
        labels=np.concatenate([f.labels for f in pieces]),
        w_tilde=float(sum(s * f.w_tilde for f, s in zip(pieces, shares, strict=True))),
        converged=all(f.converged for f in pieces),
        class_mass=np.sum([s * f.class_mass for f, s in zip(pieces, shares, strict=True)], axis=0),
        back_mapped=back,
        points=np.vstack([f.points for f in pieces]),
        weights=weights,
        # the pieces are one fit of the batch
        traffic=replace(sum((f.traffic for f in pieces), Traffic()), fits=1),
        warm=pieces[0].warm,
    )


@dataclass
class Fitted:
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
        self.model, self.pred = train_classifier(view, self.mapped, self.mapped_labels, cfg)
        if cfg.classifier in ROW_CLASSIFIERS:  # then on the target's own rows, so labeled
            mass = np.sum([f.class_mass for f in self.fits], axis=0)
            got = fit_on_rows(view.x, self.pred, row_confidence(mass, self.pred), cfg.classifier)
            if got is not None:
                self.model, self.pred = got


def row_confidence(class_mass: np.ndarray, labels: np.ndarray) -> np.ndarray | None:
    """Each target row's soft label read at ``labels``: the share of the mass the row receives
    under the plan that comes from the class it is labeled (``class_mass``: (q, m)); None when
    the plans cover a subset of the rows (``target_batch``): every row then weighs the same."""
    if class_mass.ndim != 2 or class_mass.shape[1] != np.asarray(labels).size:
        return None
    total = np.maximum(class_mass.sum(axis=0), 1e-300)
    q = class_mass.shape[0]
    at = np.clip(np.asarray(labels, dtype=np.int64), 0, q - 1)
    return np.asarray(class_mass[at, np.arange(labels.size)] / total)


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


def train_classifier(view: TargetView, x_src: np.ndarray, y_src: np.ndarray, cfg: AdaptConfig):
    """(model, predictions on every target row) from mapped rows plus labeled target rows."""
    known = view.known >= 0
    x_train = np.vstack([x_src, view.x[known]])
    y_train = np.concatenate([y_src, view.known[known]])
    return fit_predict(x_train, y_train, view.x, cfg.classifier, cfg.seed)


def view_accuracy(pred: np.ndarray, view: TargetView) -> float | None:
    return accuracy(pred, view.labels) if view.labels is not None else None
