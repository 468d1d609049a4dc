"""Noise samplers and sensitivities: the only place where privacy noise is drawn.

Every sampler takes ``rng: np.random.Generator``. Production code builds it with
``common.rng.secure_rng()`` (seeded from ``secrets``); tests pass ``np.random.default_rng(0)``.
The global ``np.random`` state is never used.

Neighbouring relations and units (DESIGN.md §2)
-----------------------------------------------
* ``add-remove`` (default): datasets differ by one record; a removed record counts as a zero row
  for per-row releases; ``ns`` and all mechanism parameters are public metadata.
* ``replace-one``: one record is replaced; every sensitivity below doubles.
* Unit ``attribute``: one feature of one record moves by at most ``feature_bound``.
  L2 sensitivity of ``X·M`` = ``feature_bound · max_i ‖M_i‖₂`` (max row norm of M).
* Unit ``record``: each *projected* row is clipped to ``‖x·M‖₂ ≤ C`` (M is data-independent,
  so clipping after projecting is a per-row operation); L2 sensitivity of a row = ``C``. (DESIGN.md
  clips before projecting, sensitivity ``C·‖M‖₂``; clipping after is never looser.)
* Aggregate releases (record unit): per-class sums of clipped rows — disjoint classes, so one
  record moves one class sum by at most ``C`` (L2) — and per-class counts (L1 sensitivity 1).
* Label histogram: integer counts, L1 sensitivity 1 (2 under replace-one).
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np


class Neighbouring(StrEnum):
    ADD_REMOVE = "add-remove"
    REPLACE_ONE = "replace-one"


class PrivacyUnit(StrEnum):
    ATTRIBUTE = "attribute"
    RECORD = "record"


def relation_factor(relation: Neighbouring | str) -> int:
    """Sensitivity multiplier of a neighbouring relation: 1 (add/remove) or 2 (replace-one)."""
    return 2 if Neighbouring(relation) is Neighbouring.REPLACE_ONE else 1


def jl_matrix(k: int, ell: int, rng: np.random.Generator) -> np.ndarray:
    """Johnson–Lindenstrauss matrix ``M ~ N(0, 1/ℓ)^{k×ℓ}`` (Algorithm 1). Data-independent."""
    if k < 1 or ell < 1:
        raise ValueError("projection shape must be positive")
    return rng.normal(0.0, 1.0 / np.sqrt(ell), size=(k, ell))


def check_projection(m: np.ndarray, k: int, orthonormal: bool) -> None:
    """Validate a projection received from a peer or built locally (no data values in errors)."""
    if m.ndim != 2 or m.shape[0] != k or m.shape[1] < 1 or m.shape[1] > k:
        raise ValueError("projection has the wrong shape")
    if not np.all(np.isfinite(m)):
        raise ValueError("projection has non-finite entries")
    if orthonormal and not np.allclose(m.T @ m, np.eye(m.shape[1]), atol=1e-6):
        raise ValueError("projection columns are not orthonormal")


def projection_sensitivity(
    m: np.ndarray,
    unit: PrivacyUnit | str,
    relation: Neighbouring | str,
    *,
    feature_bound: float = 1.0,
    clip_norm: float = 1.0,
) -> float:
    """L2 sensitivity of one released row ``x·M`` under the unit and relation (see module doc)."""
    unit = PrivacyUnit(unit)
    factor = relation_factor(relation)
    if unit is PrivacyUnit.ATTRIBUTE:
        if feature_bound <= 0:
            raise ValueError("feature_bound must be > 0")
        w = float(np.max(np.linalg.norm(m, axis=1)))
        return factor * feature_bound * w
    if clip_norm <= 0:
        raise ValueError("clip_norm must be > 0")
    return factor * clip_norm


def clip_rows(x: np.ndarray, clip_norm: float) -> np.ndarray:
    """Scale each row down to ``‖x_i‖₂ ≤ C`` (a per-row operation, so DP-clean)."""
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    scale = np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))
    return x * scale


def class_sums(z: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    """Per-class sums ``(q, d)`` of the rows ``z (n, d)`` (private; leaves only with noise)."""
    out = np.zeros((n_classes, z.shape[1]))
    np.add.at(out, y, z)
    return out


def gaussian_noise(shape: tuple[int, ...], std: float, rng: np.random.Generator) -> np.ndarray:
    """I.i.d. ``N(0, std²)`` noise; ``std`` is absolute (noise multiplier × sensitivity)."""
    if not (np.isfinite(std) and std >= 0):
        raise ValueError("noise std must be finite and ≥ 0")
    return rng.normal(0.0, std, size=shape)


def discrete_laplace_noise(
    shape: tuple[int, ...], parameter: float, rng: np.random.Generator
) -> np.ndarray:
    """Two-sided geometric noise DLap(a): ``P(x) = tanh(a/2)·exp(-a|x|)`` on the integers.

    Drawn as the difference of two i.i.d. geometric variables with success probability
    ``1 - e^{-a}`` (failures before success), which is exactly DLap(a); integers throughout, so
    no floating-point leak in the noisy counts. Variance: ``2e^{-a} / (1 - e^{-a})²``.
    """
    if not (np.isfinite(parameter) and parameter > 0):
        raise ValueError("discrete Laplace parameter must be > 0")
    q = -np.expm1(-parameter)  # 1 - e^{-a}, accurate for small a
    g1 = rng.geometric(q, size=shape) - 1
    g2 = rng.geometric(q, size=shape) - 1
    return (g1 - g2).astype(np.int64)


def discrete_laplace_variance(parameter: float) -> float:
    e = np.exp(-parameter)
    return float(2.0 * e / (1.0 - e) ** 2)


def label_counts(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Exact class counts (private; only ever leaves through a noisy mechanism)."""
    return np.bincount(labels, minlength=n_classes).astype(np.int64)


def counts_to_labels(noisy_counts: np.ndarray, n_rows: int) -> np.ndarray:
    """Post-processing: noisy counts → one label per label-sorted row.

    Negative counts are clipped to 0, the rest rescaled to sum exactly to ``n_rows`` with the
    largest-remainder rule; labels come out as contiguous blocks in class order. Uses only the
    released counts and the (public) number of released rows.
    """
    c = np.clip(np.asarray(noisy_counts, dtype=float), 0.0, None)
    q = c.size
    if n_rows == 0:
        return np.zeros(0, dtype=np.int64)
    if c.sum() <= 0:
        c = np.ones(q)
    share = c * (n_rows / c.sum())
    base = np.floor(share).astype(np.int64)
    rest = n_rows - int(base.sum())
    if rest > 0:
        order = np.argsort(-(share - base), kind="stable")
        base[order[:rest]] += 1
    return np.repeat(np.arange(q, dtype=np.int64), base)
