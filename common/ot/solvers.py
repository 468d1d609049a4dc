"""Regularized OT solvers (POT inside), returning a frozen result that says how the solve went.

Problem (DPDA, Algorithm 2)::

    min_γ ⟨γ, C⟩ + λe Σ γ log γ + λg Σ_j Σ_c ‖γ(I_c, j)‖₂     s.t. γ1 = a, γᵀ1 = b, γ ≥ 0

Shapes: ``a (n,)``, ``b (m,)``, ``cost (n, m)``, ``labels (n,)`` integers in ``[0, q)``.

The cost is normalized before the solve (``costs.normalize``) so the regularization strengths are
scale-free; POT's solvers fail almost silently on unnormalized costs (DESIGN.md §9). After every
solve the plan is checked: non-finite entries or a plan whose mass is far from 1 raise
``SolverFailed``; marginal violation above ``tol`` is reported as ``converged=False``. POT's
warnings become data (``OTResult.warnings``), never silent.

The group-lasso term is written with one-hot matrix products (``Yᵀ(γ∘γ)`` gives the per-class,
per-column squared norms) inside ``ot.optim.gcg``: the same regularizer as POT's
``ot.da.sinkhorn_l1l2_gl`` without its per-class copies of the plan (DESIGN.md §9).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import numpy as np
import ot

from ..errors import SolverFailed

_EPS_NORM = 1e-12
MASK_COST = 1e3  # masked entries of a normalized cost: exp(-1e3 / λe) underflows to exactly 0


@dataclass(frozen=True)
class OTResult:
    plan: np.ndarray  # (n, m)
    transport_cost: float  # ⟨γ, C⟩ on the cost the caller passed (before normalization)
    n_iter: int
    converged: bool
    marginal_error: float  # max(‖γ1 − a‖₁, ‖γᵀ1 − b‖₁)
    warnings: tuple[str, ...] = field(default_factory=tuple)


def uniform(n: int) -> np.ndarray:
    return np.full(n, 1.0 / n)


def one_hot(labels: np.ndarray, n_classes: int | None = None) -> np.ndarray:
    labels = np.asarray(labels, dtype=np.int64)
    q = int(labels.max()) + 1 if n_classes is None else n_classes
    y = np.zeros((labels.size, q))
    y[np.arange(labels.size), labels] = 1.0
    return y


def _check_inputs(a: np.ndarray, b: np.ndarray, cost: np.ndarray) -> None:
    if cost.ndim != 2 or cost.shape != (a.size, b.size):
        raise ValueError("cost must have shape (len(a), len(b))")
    if not np.all(np.isfinite(cost)):
        raise ValueError("cost has non-finite entries")
    for w in (a, b):
        if np.any(w < 0) or not np.isclose(w.sum(), 1.0, atol=1e-8):
            raise ValueError("marginals must be non-negative and sum to 1")


def _finish(
    plan: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    cost: np.ndarray,
    n_iter: int,
    caught: list[warnings.WarningMessage],
    tol: float,
) -> OTResult:
    if not np.all(np.isfinite(plan)):
        raise SolverFailed("transport plan has non-finite entries")
    mass = float(plan.sum())
    if not (0.5 < mass < 1.5):
        raise SolverFailed("transport plan is degenerate (mass far from 1)")
    err = max(float(np.abs(plan.sum(axis=1) - a).sum()), float(np.abs(plan.sum(axis=0) - b).sum()))
    msgs = tuple(sorted({str(w.message) for w in caught}))
    return OTResult(
        plan=plan,
        transport_cost=float(np.sum(plan * cost)),
        n_iter=n_iter,
        converged=err <= tol,
        marginal_error=err,
        warnings=msgs,
    )


def sinkhorn(
    a: np.ndarray,
    b: np.ndarray,
    cost: np.ndarray,
    reg: float,
    *,
    max_iter: int = 1000,
    stop_thr: float = 1e-9,
    tol: float = 1e-3,
) -> OTResult:
    """Entropic OT ``min ⟨γ,C⟩ + reg·Σγlogγ`` with ``ot.sinkhorn`` (cost already normalized)."""
    _check_inputs(a, b, cost)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan, log = ot.sinkhorn(a, b, cost, reg, numItermax=max_iter, stopThr=stop_thr, log=True)
    return _finish(np.asarray(plan), a, b, cost, int(log.get("niter", max_iter)), caught, tol)


def group_lasso_terms(y: np.ndarray):  # noqa: ANN201 - returns two closures
    """f(γ) = Σ_j Σ_c ‖γ(I_c, j)‖₂ and its gradient, with one-hot ``y (n, q)``."""

    def f(g: np.ndarray) -> float:
        return float(np.sqrt(y.T @ (g * g)).sum())

    def df(g: np.ndarray) -> np.ndarray:
        norms = np.sqrt(y.T @ (g * g))  # (q, m)
        return g / np.maximum(y @ norms, _EPS_NORM)

    return f, df


def sinkhorn_group_lasso(
    a: np.ndarray,
    b: np.ndarray,
    cost: np.ndarray,
    labels: np.ndarray,
    reg_e: float,
    reg_g: float,
    *,
    outer_iter: int = 10,
    inner_iter: int = 200,
    stop_thr: float = 1e-9,
    tol: float = 1e-3,
    warm_start: bool = True,
) -> OTResult:
    """Entropic + group-lasso OT by generalized conditional gradient (``ot.optim.gcg``).

    ``warm_start=False`` starts from ``a·bᵀ`` exactly as POT's ``sinkhorn_l1l2_gl`` does.
    """
    _check_inputs(a, b, cost)
    labels = np.asarray(labels)
    if labels.shape != (a.size,):
        raise ValueError("labels must have shape (n,)")
    f, df = group_lasso_terms(one_hot(labels))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # Start from the entropic plan, not POT's default a·bᵀ: every iterate is then a convex
        # combination of plans that respect masked (forbidden) entries exactly.
        g0 = (
            ot.sinkhorn(a, b, cost, reg_e, numItermax=inner_iter, stopThr=stop_thr)
            if warm_start
            else None
        )
        plan, log = ot.optim.gcg(
            a,
            b,
            cost,
            reg_e,
            reg_g,
            f,
            df,
            G0=g0,
            numItermax=outer_iter,
            numInnerItermax=inner_iter,
            stopThr=stop_thr,
            log=True,
        )
    n_iter = len(log.get("loss", [])) - 1
    return _finish(np.asarray(plan), a, b, cost, max(n_iter, 0), caught, tol)
