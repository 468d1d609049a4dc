"""The DPDA job on the target: releases → debiased cost → entropic + group-lasso OT →
barycentric images in the target's own space → a local classifier.

The job takes *a source of releases* behind one small interface (``ReleaseSource``) with two
implementations: the in-process ``SourceReleaser`` and the gRPC client. Everything it computes
from releases is post-processing and costs no budget.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from common.data.loaders import Domain
from common.data.preprocessing import Scaling, per_row
from common.dp.mechanisms import counts_to_labels
from common.ot.costs import dpot_cost, label_mask
from common.ot.mapping import barycentric_map
from common.ot.solvers import sinkhorn_group_lasso, uniform
from common.terms import SessionTerms
from source_party.releases import BatchRelease, SessionInfo, TargetDisclosure

from .training import accuracy, fit_predict


class ReleaseSource(Protocol):
    def open_session(
        self, terms: SessionTerms, disclosure: TargetDisclosure, session_id: str | None = None
    ) -> SessionInfo: ...
    def release(self, session_id: str, index: int, peer: str = ...) -> BatchRelease: ...
    def close_session(self, session_id: str) -> None: ...


@dataclass(frozen=True)
class AdaptConfig:
    reg_e: float = 0.02  # entropic strength on the max-normalized cost
    reg_g: float = 0.5  # group-lasso strength
    outer_iter: int = 10
    inner_iter: int = 200
    classifier: str = "1nn"
    seed: int = 0


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
    accuracy: float | None
    epsilon_spent: float
    delta: float
    noise_multiplier: float
    noise_std: float
    projection_dim: int
    n_batches: int
    rows_received: int
    w_tilde: float  # mean over batches of ⟨γ, C̃⟩
    solver_converged: bool
    predictions: np.ndarray
    mapped: np.ndarray = field(repr=False)
    mapped_labels: np.ndarray = field(repr=False)
    noisy_counts: list[list[int]] = field(default_factory=list, repr=False)
    batch_spend: list[float] = field(default_factory=list, repr=False)


def adapt_batch(
    rel: BatchRelease, xt_proj: np.ndarray, view: TargetView, cfg: AdaptConfig
) -> tuple[np.ndarray, np.ndarray, float, bool]:
    """One release → (mapped rows in target space, their labels, W̃, converged)."""
    n = rel.z.shape[0]
    ys = counts_to_labels(rel.noisy_counts, n)
    mask = label_mask(ys, view.known) if np.any(view.known >= 0) else None
    cost = dpot_cost(rel.z, xt_proj, rel.spec.features.noise_std, mask)
    res = sinkhorn_group_lasso(
        uniform(n),
        uniform(xt_proj.shape[0]),
        cost.normalized,
        ys,
        cfg.reg_e,
        cfg.reg_g,
        outer_iter=cfg.outer_iter,
        inner_iter=cfg.inner_iter,
    )
    w = float(np.sum(res.plan * cost.debiased))
    return barycentric_map(res.plan, view.x), ys, w, res.converged


def run_dpda(
    source: ReleaseSource,
    view: TargetView,
    terms: SessionTerms,
    cfg: AdaptConfig,
    spent: Callable[[], float],
    progress: Callable[[int, int], None] | None = None,
) -> DPDAResult:
    """Run one DPDA job against ``source``; ``spent()`` reads ε from the target's ledger."""
    basis = (
        target_pca_basis(view.x, terms.projection_dim) if terms.projection == "target-pca" else None
    )
    info = source.open_session(terms, TargetDisclosure(view.scaling, basis))
    xt_proj = view.x @ info.projection
    mapped, labels, ws, conv, counts, spend = [], [], [], True, [], []
    rows = 0
    for i in range(info.plan.steps):
        rel = source.release(info.session_id, i)
        x_hat, ys, w, ok = adapt_batch(rel, xt_proj, view, cfg)
        mapped.append(x_hat)
        labels.append(ys)
        ws.append(w)
        conv &= ok
        rows += rel.z.shape[0]
        counts.append([int(c) for c in rel.noisy_counts])
        spend.append(spent())
        if progress:
            progress(i + 1, info.plan.steps)
    source.close_session(info.session_id)
    xs_hat = np.vstack(mapped)
    ys_hat = np.concatenate(labels)
    known = view.known >= 0
    x_train = np.vstack([xs_hat, view.x[known]])
    y_train = np.concatenate([ys_hat, view.known[known]])
    _, pred = fit_predict(x_train, y_train, view.x, cfg.classifier, cfg.seed)
    acc = accuracy(pred, view.labels) if view.labels is not None else None
    spec = info.plan.spec(terms)
    return DPDAResult(
        accuracy=acc,
        epsilon_spent=spent(),
        delta=terms.delta,
        noise_multiplier=spec.features.noise_multiplier,
        noise_std=spec.features.noise_std,
        projection_dim=info.projection.shape[1],
        n_batches=info.plan.steps,
        rows_received=rows,
        w_tilde=float(np.mean(ws)),
        solver_converged=conv,
        predictions=pred,
        mapped=xs_hat,
        mapped_labels=ys_hat,
        noisy_counts=counts,
        batch_spend=spend,
    )
