"""Choosing the transport's strengths without target labels (a real target has none).

Circular (reverse) validation on what the target already holds: for each ``(reg_e, reg_g)``
of ``GRID`` the received releases are transported again, a classifier is trained on the mapped
source rows and labels the target's rows; then, in the projection space both parties share,
each transported source point looks at its 20 nearest target rows, and the score is the
(mass-weighted) share of them whose pseudo-label is the point's own label. A transport that
moves classes onto the wrong target clusters cannot send its labels back. Everything here is
post-processing of the releases and the target's own rows: no budget. When the target has
labels (a benchmark, a rehearsal) each candidate's accuracy is recorded beside its score — for
the report only, never for the choice.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import numpy as np
from sklearn.neighbors import NearestNeighbors

from dpda.errors import SolverFailed
from dpda.target_party.training import accuracy

if TYPE_CHECKING:
    from dpda.target_party.fitting import Fitted, JobSession
    from dpda.target_party.view import TargetView

log = logging.getLogger("dpda.target")

# (reg_e, reg_g): entropic strength on the max-normalized cost × group-lasso strength
GRID = tuple((e, g) for e in (0.01, 0.02, 0.05, 0.1) for g in (0.1, 0.5, 2.0))
SELECT_MAX_CELLS = 2e7  # plan entries over all releases; above it the grid would cost minutes
NEIGHBOURS = 20  # target rows consulted per source point (chosen among 5, 20, 50: README)


def circular_score(
    fits: list[Any],
    xt_proj: np.ndarray,
    pseudo: np.ndarray,
    k: int = NEIGHBOURS,
    index: NearestNeighbors | None = None,
) -> float:
    """How well the target's pseudo-labels send the source's labels back: for each transported
    source point, the share of its ``k`` nearest target rows (projection space) whose
    pseudo-label is the point's label, averaged with the points' masses."""
    pts = np.vstack([f.points for f in fits])
    if pts.shape[1] != xt_proj.shape[1]:  # class-gaussians carry (mean, variance) halves
        pts = pts[:, : xt_proj.shape[1]]
    labels = np.concatenate([f.labels for f in fits])
    w = np.concatenate([f.weights for f in fits])
    k = min(k, xt_proj.shape[0])
    if index is None:
        index = NearestNeighbors(n_neighbors=k).fit(xt_proj)
    idx = index.kneighbors(pts, n_neighbors=k, return_distance=False)
    hit = (pseudo[idx] == labels[:, None]).mean(axis=1)
    return float(np.sum(w * hit) / np.sum(w))


CLUSTER_SAMPLE = 2000  # target rows the cluster score reads (its cost is quadratic in them)
CLUSTER_MEMORY_MB = 1  # the cluster score's working memory (its distances, in row blocks)


def cluster_score(xt_proj: np.ndarray, pred: np.ndarray, seed: int) -> float:
    """How well the labels ``pred`` cut the target's rows into clusters, without target
    labels: the mean silhouette of the rows in the OT space (at most ``CLUSTER_SAMPLE`` of
    them, drawn from ``seed``), in [-1, 1]; -1 when the labels name one class. It compares two
    labellings of the same rows (DPDA's and the release's without adaptation), where the
    circular score, read on a few class points, cannot tell them apart."""
    import sklearn
    from sklearn.metrics import silhouette_score

    if np.unique(pred).size < 2 or np.unique(pred).size >= xt_proj.shape[0]:
        return -1.0
    n = min(CLUSTER_SAMPLE, xt_proj.shape[0])
    # the distances in row blocks of a few MB, not one n × n matrix (32 MB at n = 2,000)
    with sklearn.config_context(working_memory=CLUSTER_MEMORY_MB):
        return float(silhouette_score(xt_proj, pred, sample_size=n, random_state=seed))


def select(s: JobSession, done: Fitted, view: TargetView) -> dict[str, Any]:
    """Pick ``(reg_e, reg_g)``; leaves the chosen config in ``s.cfg`` and its fits in
    ``done.fits``. Returns what was chosen and every candidate's score."""
    cfg = s.cfg
    chosen = {"method": cfg.select, "reg_e": cfg.reg_e, "reg_g": cfg.reg_g}
    if cfg.select == "none":
        return chosen
    if cfg.select != "circular":
        raise ValueError(f"unknown selection {cfg.select!r} (circular, none)")
    cells = sum(f.points.shape[0] for f in done.fits) * s.xt_proj.shape[0]
    if cells > SELECT_MAX_CELLS or (0 < cfg.target_batch < view.x.shape[0]):
        log.warning(
            "model selection skipped: %.3g plan entries per round is more than %.3g; "
            "keeping reg_e=%g reg_g=%g",
            cells,
            SELECT_MAX_CELLS,
            cfg.reg_e,
            cfg.reg_g,
        )
        return {**chosen, "method": "skipped (size)"}
    candidates = []
    best: tuple[float, Any, list[Any]] | None = None
    index = NearestNeighbors().fit(s.xt_proj)  # the target's rows: one index for every pair
    for reg_e, reg_g in GRID:
        s.cfg = dataclasses.replace(cfg, reg_e=reg_e, reg_g=reg_g)
        try:
            if (reg_e, reg_g) == (cfg.reg_e, cfg.reg_g):
                fits = done.fits  # fitted as the releases arrived
            else:
                fits = s.fit_all(done.releases, view)
        except SolverFailed:
            continue
        trial = dataclasses.replace(done, fits=fits)
        trial.train(view, s.cfg)
        assert trial.pred is not None
        score = circular_score(fits, s.xt_proj, trial.pred, index=index)
        row = {"reg_e": reg_e, "reg_g": reg_g, "score": score}
        if view.labels is not None:
            row["accuracy"] = accuracy(trial.pred, view.labels)
        candidates.append(row)
        # ties go to the configured pair (the grid is coarse on a few prototypes)
        configured = (reg_e, reg_g) == (cfg.reg_e, cfg.reg_g)
        if best is None or score > best[0] + 1e-12 or (configured and score >= best[0] - 1e-12):
            best = (score, s.cfg, fits)
    if best is None:  # every candidate failed: keep the configured pair
        s.cfg = cfg
        return {**chosen, "method": "none (every candidate failed)"}
    s.cfg, done.fits = best[1], best[2]
    return {
        "method": "circular",
        "reg_e": s.cfg.reg_e,
        "reg_g": s.cfg.reg_g,
        "score": best[0],
        "candidates": candidates,
    }
