"""Transport costs: squared Euclidean, the DPOT debiasing and a recorded normalization.

``C̃_ij = ‖Z_i − (Xt·M)_j‖² − ℓσ²`` (Algorithm 1): the subtraction removes ``E‖Δ_i‖² = ℓσ²`` from
the Wasserstein estimate. A constant shift leaves a balanced plan unchanged, so it only matters
for ``W̃``. Normalization divides by the largest *undebiased* squared distance, so the private and
the non-private solves see the same scale and the plan does not depend on the debiasing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .solvers import MASK_COST


@dataclass(frozen=True)
class Cost:
    debiased: np.ndarray  # (n, m) C̃ = raw − bias
    normalized: np.ndarray  # (n, m) raw / scale, masked entries set to MASK_COST
    bias: float  # ℓσ² (0 for a non-private cost)
    scale: float  # divisor used for normalization


def sq_euclidean(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pairwise ‖x_i − y_j‖², ``x (n, d)``, ``y (m, d)`` → ``(n, m)``, clipped at 0."""
    xx = np.einsum("ij,ij->i", x, x)[:, None]
    yy = np.einsum("ij,ij->i", y, y)[None, :]
    return np.maximum(xx + yy - 2.0 * (x @ y.T), 0.0)


def label_mask(source_labels: np.ndarray, target_labels: np.ndarray) -> np.ndarray:
    """True where mass is forbidden: target row j has a label (≥ 0) different from source row i.

    ``target_labels`` holds −1 for unlabeled target rows (no restriction).
    """
    ys = np.asarray(source_labels)[:, None]
    yt = np.asarray(target_labels)[None, :]
    return (yt >= 0) & (ys != yt)


def dpot_cost(
    z: np.ndarray, xt_proj: np.ndarray, noise_std: float = 0.0, mask: np.ndarray | None = None
) -> Cost:
    """Debiased, normalized cost between noisy source rows ``z (n, ℓ)`` and ``xt_proj (m, ℓ)``."""
    raw = sq_euclidean(z, xt_proj)
    bias = z.shape[1] * noise_std**2
    scale = float(raw.max())
    if not np.isfinite(scale) or scale <= 0:
        scale = 1.0
    norm = raw / scale
    if mask is not None:
        norm = np.where(mask, MASK_COST, norm)
    return Cost(debiased=raw - bias, normalized=norm, bias=bias, scale=scale)
