"""Transport costs: squared Euclidean, the DPOT debiasing and a recorded normalization.

``C̃_ij = ‖Z_i − (Xt·M)_j‖² − ℓσ²`` (Algorithm 1): the subtraction removes ``E‖Δ_i‖² = ℓσ²`` from
the Wasserstein estimate. A constant shift leaves a balanced plan unchanged, so it only matters
for ``W̃``. Normalization divides by the largest *undebiased* squared distance, so the private and
the non-private solves see the same scale and the plan does not depend on the debiasing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpda.ot.solvers import MASK_COST

_BLOCK = 1 << 18  # elements of the cost finished at a time (1 MB of float32, held in cache)


@dataclass(frozen=True)
class Cost:
    normalized: np.ndarray  # (n, m) float32: raw / scale, masked entries set to MASK_COST
    bias: float  # ℓσ² (0 for a non-private cost)
    scale: float  # divisor used for normalization

    @property
    def debiased(self) -> np.ndarray:
        """``C̃ = raw − bias`` (n, m) float64, made on demand (masked entries are meaningless)."""
        return self.normalized.astype(np.float64) * self.scale - self.bias

    def value(self, plan: np.ndarray) -> float:
        """``W̃ = ⟨γ, C̃⟩`` for a plan that puts no mass on masked entries."""
        from dpda.ot.fast import dot64

        return self.scale * dot64(plan, self.normalized) - self.bias * float(
            plan.sum(dtype=np.float64)
        )


def sq_euclidean(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pairwise ‖x_i − y_j‖², ``x (n, d)``, ``y (m, d)`` → ``(n, m)``, clipped at 0."""
    xx = np.einsum("ij,ij->i", x, x)[:, None]
    yy = np.einsum("ij,ij->i", y, y)[None, :]
    d: np.ndarray = np.maximum(xx + yy - 2.0 * (x @ y.T), 0.0)
    return d


def label_mask(source_labels: np.ndarray, target_labels: np.ndarray) -> np.ndarray:
    """True where mass is forbidden: target row j has a label (≥ 0) different from source row i.

    ``target_labels`` holds −1 for unlabeled target rows (no restriction).
    """
    ys = np.asarray(source_labels)[:, None]
    yt = np.asarray(target_labels)[None, :]
    mask: np.ndarray = (yt >= 0) & (ys != yt)
    return mask


def dpot_cost(
    z: np.ndarray,
    xt_proj: np.ndarray,
    noise_std: float = 0.0,
    mask: np.ndarray | None = None,
    out: np.ndarray | None = None,
) -> Cost:
    """Debiased, normalized cost between noisy source rows ``z (n, ℓ)`` and ``xt_proj (m, ℓ)``.

    Built in the float32 result (one product, then each block of rows finished and its maximum
    taken while it is in cache), from both sides centred on the target's mean (distances
    do not change; the expansion ``‖z‖² + ‖x‖² − 2z·x`` then loses little to float32); so an
    ``n × m`` cost costs ``4nm`` bytes, no ``n × m`` temporaries and three passes (the product,
    the finish, the normalization). ``out``: a float32 ``(n, m)`` array to build it in.
    """
    n, m = z.shape[0], xt_proj.shape[0]
    if out is None or out.shape != (n, m) or out.dtype != np.float32:
        out = np.empty((n, m), dtype=np.float32)
    mu = xt_proj.mean(axis=0) if m else 0.0
    zc = np.asarray(z - mu, dtype=np.float32)
    xc = np.asarray(xt_proj - mu, dtype=np.float32)
    xt_t = np.ascontiguousarray(xc.T)
    zz = np.einsum("ij,ij->i", zc, zc, dtype=np.float64).astype(np.float32)
    yy = np.einsum("ij,ij->i", xc, xc, dtype=np.float64).astype(np.float32)
    # one GEMM for the whole product (BLAS is fast on it and slow on thin blocks of rows), then
    # each block finished and its maximum taken while it is in cache
    np.matmul(zc, xt_t, out=out)
    rows = max(1, _BLOCK // max(m, 1))
    top = 0.0
    for i in range(0, n, rows):
        blk = out[i : i + rows]
        blk *= np.float32(-2.0)
        blk += zz[i : i + rows, None]
        blk += yy
        np.maximum(blk, np.float32(0.0), out=blk)
        if blk.size:
            top = max(top, float(blk.max()))
    bias = z.shape[1] * noise_std**2
    scale = top if out.size else 1.0
    if not np.isfinite(scale) or scale <= 0:
        scale = 1.0
    out *= np.float32(1.0 / scale)
    if mask is not None:
        out[mask] = MASK_COST
    return Cost(normalized=out, bias=bias, scale=scale)
