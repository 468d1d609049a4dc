"""Barycentric mapping into the target's own raw feature space."""

from __future__ import annotations

import numpy as np


def barycentric_map(plan: np.ndarray, xt: np.ndarray, mass: np.ndarray | None = None) -> np.ndarray:
    """``X̂s = diag(γ1)⁻¹ γ Xt``; ``plan (n, m)``, ``xt (m, d)`` → ``(n, d)``; ``mass``: the
    plan's row sums ``γ1`` when the caller has them (no pass over the plan to sum it).

    Rows of the plan with (numerically) no mass are mapped to the target mean rather than to 0.
    A float32 plan is multiplied in float32 (casting the ``m × d`` features, not the ``n × m``
    plan); the result is float64 either way.
    """
    if mass is None:
        row = plan.sum(axis=1, keepdims=True, dtype=np.float64)
    else:
        row = np.asarray(mass, dtype=np.float64).reshape(-1, 1)
    if plan.dtype == np.float32:
        mapped = (plan @ xt.astype(np.float32, copy=False)).astype(np.float64)
    else:
        mapped = plan @ xt
    empty = row[:, 0] <= 1e-300
    out = mapped / np.where(empty[:, None], 1.0, row)
    if np.any(empty):
        out[empty] = xt.mean(axis=0)
    return out
