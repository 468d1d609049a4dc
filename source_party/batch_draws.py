"""The batch release mechanisms: the sample and the noise of one release whose ledger entry is
already durable (``SourceReleaser.draw``). Each reads the session's prepared features ``x``,
the labels ``y``, the release's public spec and the session's noise stream ``rng``; nothing
leaves but the mechanism's output.

* ``draw_rows`` — noisy projected rows, label-sorted and shuffled within each class, with
  noisy counts;
* ``draw_aggregate`` — per-class sums (+ sums of squares), or DP-Sinkhorn synthetic points;
* ``draw_metric`` — the learned ground cost W.
"""

from __future__ import annotations

import numpy as np

from dpda.dp.events import BatchSpec, MetricSpec
from dpda.dp.ledger import LedgerEntry
from dpda.dp.mechanisms import (
    class_sums,
    clip_rows,
    discrete_laplace_noise,
    finite_rows,
    gaussian_noise,
    label_counts,
    nonnegative_rows,
    row_cells,
)
from dpda.dp.metric import train_metric
from dpda.dp.sinkhorn_synthetic import train_synthetic
from dpda.protocol import BatchRelease, SessionInfo
from dpda.terms import SessionTerms, metric_params, synthetic_params


def draw_rows(
    x: np.ndarray,
    y: np.ndarray,
    terms: SessionTerms,
    spec: BatchSpec,
    info: SessionInfo,
    index: int,
    entry: LedgerEntry,
    rng: np.random.Generator,
) -> BatchRelease:
    """A batch of the session's release kind under a ``BatchSpec``: rows, or aggregates."""
    if terms.release != "rows":
        return draw_aggregate(x, y, terms, spec, info, index, entry, rng)
    if spec.sampling_rate is None:
        rows = np.arange(x.shape[0])
    else:
        rows = np.flatnonzero(rng.random(x.shape[0]) < spec.sampling_rate)
    # Label-sorted blocks, random order inside each class (no link to storage order).
    rows = rows[rng.permutation(rows.size)]
    rows = rows[np.argsort(y[rows], kind="stable")]
    with np.errstate(over="ignore", invalid="ignore"):
        proj = finite_rows(x[rows] @ info.projection)
    if terms.privacy_unit == "record":
        proj = clip_rows(proj, terms.clip_norm)
    z = proj + gaussian_noise(proj.shape, spec.features.noise_std, rng)
    counts = label_counts(y[rows], info.n_classes)
    return BatchRelease(index, z, noisy_counts(counts, spec, rng), spec, entry.seq)


def draw_metric(
    x: np.ndarray,
    y: np.ndarray,
    terms: SessionTerms,
    spec: MetricSpec,
    info: SessionInfo,
    index: int,
    entry: LedgerEntry,
    rng: np.random.Generator,
) -> BatchRelease:
    """The learned ground cost W (``dpda.dp.metric``): rows projected, made finite and
    clipped to the session's norm C as for every record-level release; the noise is the
    spec's σ·2mG on each step's clipped pair-gradient sum. Nothing but W leaves (no counts)."""
    with np.errstate(over="ignore", invalid="ignore"):
        z = clip_rows(x @ info.projection, terms.clip_norm)
    w = train_metric(z, y, metric_params(terms), terms.clip_norm, spec.noise_multiplier, rng)
    return BatchRelease(index, w, np.zeros(0, dtype=np.int64), spec, entry.seq)


def noisy_counts(counts: np.ndarray, spec: BatchSpec, rng: np.random.Generator) -> np.ndarray:
    """The class counts under the spec's histogram mechanism."""
    h = spec.histogram
    if h.mechanism == "discrete_laplace":
        noisy = counts + discrete_laplace_noise(counts.shape, h.parameter, rng)
    else:
        noise = gaussian_noise(counts.shape, h.noise_std, rng)
        noisy = np.rint(counts + noise).astype(np.int64)
    return noisy


def draw_aggregate(
    x: np.ndarray,
    y: np.ndarray,
    terms: SessionTerms,
    spec: BatchSpec,
    info: SessionInfo,
    index: int,
    entry: LedgerEntry,
    rng: np.random.Generator,
) -> BatchRelease:
    """Per-class sums of clipped projected rows (+ sums of squares) with Gaussian noise, or
    DP-Sinkhorn synthetic points (``dpda.dp.sinkhorn_synthetic``) trained on those rows."""
    c = terms.clip_norm
    with np.errstate(over="ignore", invalid="ignore"):
        # the source's own space: the identity map, applied as what it is; with enforced
        # non-negative rows every row is max(x, 0) first (the √2·C bound of the spec)
        if terms.nonnegative_rows:
            z = clip_rows(nonnegative_rows(x), c)
        else:
            z = clip_rows(finite_rows(x) if terms.source_space else x @ info.projection, c)
    if terms.release == "sinkhorn-synthetic":
        # counts first: they set the points per class and the gradients' scale
        noisy = noisy_counts(label_counts(y, info.n_classes), spec, rng)
        pts = train_synthetic(
            z, y, noisy, synthetic_params(terms), spec.features.noise_multiplier, rng
        )
        return BatchRelease(index, pts, noisy, spec, entry.seq)
    # with cells, one sum and count per (class, cell), class-major: a row still enters one sum
    groups, q = y, info.n_classes
    if terms.cells > 1:
        groups, q = y * terms.cells + row_cells(z, terms.cells, rng), q * terms.cells
    sums = class_sums(z, groups, q)  # one record moves one row by ≤ C
    if terms.release == "prototypes":
        out = sums + gaussian_noise(sums.shape, spec.features.noise_std, rng)
    else:
        # [S/C, Q/C²]: one record moves one class block by ≤ √2 (the spec's sensitivity)
        v = np.hstack([sums / c, class_sums(z * z, groups, q) / (c * c)])
        v = v + gaussian_noise(v.shape, spec.features.noise_std, rng)
        ell = z.shape[1]
        out = np.hstack([v[:, :ell] * c, v[:, ell:] * (c * c)])
    counts = label_counts(groups, q)
    return BatchRelease(index, out, noisy_counts(counts, spec, rng), spec, entry.seq)
