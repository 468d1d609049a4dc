"""Regularized OT solvers (POT inside), returning a frozen result that says how the solve went.

Problem (DPDA, Algorithm 2)::

    min_γ ⟨γ, C⟩ + λe Σ γ log γ + λg Σ_j Σ_c ‖γ(I_c, j)‖₂     s.t. γ1 = a, γᵀ1 = b, γ ≥ 0

Shapes: ``a (n,)``, ``b (m,)``, ``cost (n, m)``, ``labels (n,)`` integers in ``[0, q)``.

The cost is normalized before the solve (``costs.normalize``) so the regularization strengths are
scale-free; POT's solvers fail almost silently on unnormalized costs. After every
solve the plan is checked: non-finite entries or a plan whose mass is far from 1 raise
``SolverFailed``; marginal violation above ``tol`` is reported as ``converged=False``. POT's
warnings become data (``OTResult.warnings``), never silent.

Two engines solve the same problems. ``engine="fast"`` (the default) is ``dpda.ot.fast``: the
same Sinkhorn and conditional-gradient iterations as POT, in float32, in place, warm-started
across outer steps, with an ``O(qm)`` line search (``dpda bench speed`` measures it against POT).
``engine="pot"`` calls ``ot.sinkhorn`` and ``ot.optim.gcg`` with the group-lasso term written as
one-hot matrix products (``Yᵀ(γ∘γ)`` gives the per-class, per-column squared norms): the same
regularizer as POT's ``ot.da.sinkhorn_l1l2_gl`` without its per-class copies of the plan;
it is the reference the fast engine is tested against.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import ot

from dpda.errors import SolverFailed
from dpda.ot import fast
from dpda.ot.traffic import Traffic

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
    # what the fast engine read (zero for POT's): kernel builds, passes over the kernel (one
    # per Sinkhorn iteration), bytes of n × m arrays read
    traffic: Traffic = field(default_factory=Traffic)
    # the dual potentials of the first entropic solve: ``start`` for the next problem with the
    # same target rows and marginal (None from the POT engine or a start at a·bᵀ)
    start_state: fast.SinkhornState | None = None
    # ``Yᵀγ (q, m)`` per label ``0 … max(labels)``, summed by the fast engine's last pass over
    # the plan (None from the POT engine)
    class_mass: np.ndarray | None = None
    # ``γ1 (n,)`` and ``γᵀ1 (m,)`` in float64, summed by the solver (None where it did not)
    rows: np.ndarray | None = None
    cols: np.ndarray | None = None


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
    # min and max carry any NaN or ±inf: two reductions, no n × m array of flags
    if cost.size and not (np.isfinite(cost.min()) and np.isfinite(cost.max())):
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
    info: fast.SolveInfo | None = None,
) -> OTResult:
    """Check the plan and wrap it; the row and column sums and ``⟨γ, C⟩`` come from ``info``
    when the fast engine has already summed them (no further pass over the plan)."""
    if info is not None and info.rows is not None and info.cols is not None:
        rows, cols = info.rows, info.cols
        finite = bool(np.isfinite(rows).all() and np.isfinite(cols).all())
    else:
        rows = plan.sum(axis=1, dtype=np.float64)
        cols = plan.sum(axis=0, dtype=np.float64)
        finite = bool(np.all(np.isfinite(plan)))
    if not finite:
        raise SolverFailed("transport plan has non-finite entries")
    mass = float(rows.sum())
    if not (0.5 < mass < 1.5):
        raise SolverFailed("transport plan is degenerate (mass far from 1)")
    err = max(float(np.abs(rows - a).sum()), float(np.abs(cols - b).sum()))
    msgs = tuple(sorted({str(w.message) for w in caught}))
    return OTResult(
        plan=plan,
        transport_cost=info.cost
        if info is not None and info.cost is not None
        else fast.dot64(plan, cost),
        n_iter=n_iter,
        converged=err <= tol,
        marginal_error=err,
        warnings=msgs,
        traffic=info.traffic if info is not None else Traffic(),
        start_state=info.start_state if info is not None else None,
        class_mass=info.class_mass if info is not None else None,
        rows=rows,
        cols=cols,
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
    engine: str = "fast",
) -> OTResult:
    """Entropic OT ``min ⟨γ,C⟩ + reg·Σγlogγ`` (cost already normalized).

    ``stop_thr`` is POT's (L2 column-marginal error) for ``engine="pot"``; the fast engine stops
    at an L1 column-marginal error of ``max(stop_thr, 1e-6)`` (float32 resolution).
    """
    _check_inputs(a, b, cost)
    if engine == "fast":
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            plan, info = fast.sinkhorn(
                a, b, cost, reg, max_iter=max_iter, stop_thr=max(stop_thr, 1e-6)
            )
        return _finish(plan, a, b, cost, info.inner[0], caught, tol)
    _check_engine(engine)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan, log = ot.sinkhorn(a, b, cost, reg, numItermax=max_iter, stopThr=stop_thr, log=True)
    return _finish(np.asarray(plan), a, b, cost, int(log.get("niter", max_iter)), caught, tol)


def _check_engine(engine: str) -> None:
    if engine != "pot":
        raise ValueError(f"unknown OT engine {engine!r} (expected 'fast' or 'pot')")


def group_lasso_terms(
    y: np.ndarray,
) -> tuple[Callable[[np.ndarray], float], Callable[[np.ndarray], np.ndarray]]:
    """f(γ) = Σ_j Σ_c ‖γ(I_c, j)‖₂ and its gradient, with one-hot ``y (n, q)``."""

    def f(g: np.ndarray) -> float:
        return float(np.sqrt(y.T @ (g * g)).sum())

    def df(g: np.ndarray) -> np.ndarray:
        norms = np.sqrt(y.T @ (g * g))  # (q, m)
        grad: np.ndarray = g / np.maximum(y @ norms, _EPS_NORM)
        return grad

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
    engine: str = "fast",
    inner_tol: float | None = None,
    start: fast.SinkhornState | None = None,
    threads: int | None = None,
    workspace: fast.Workspace | None = None,
) -> OTResult:
    """Entropic + group-lasso OT by generalized conditional gradient (POT's ``gcg`` iterations):
    ``group_lasso_fast`` (``engine="fast"``) or ``group_lasso_pot`` (``engine="pot"``), which
    document their arguments. The fast engine's own options (``inner_tol``, ``start``,
    ``threads``, ``workspace``) are refused with the POT engine."""
    _check_inputs(a, b, cost)
    labels = np.asarray(labels)
    if labels.shape != (a.size,):
        raise ValueError("labels must have shape (n,)")
    if engine == "fast":
        return group_lasso_fast(
            a, b, cost, labels, reg_e, reg_g, outer_iter=outer_iter, inner_iter=inner_iter,
            stop_thr=stop_thr, tol=tol, warm_start=warm_start, inner_tol=inner_tol, start=start,
            threads=threads, workspace=workspace,
        )  # fmt: skip
    _check_engine(engine)
    if not (inner_tol is None and start is None and threads is None and workspace is None):
        raise ValueError("inner_tol, start, threads and workspace serve the fast engine only")
    return group_lasso_pot(
        a, b, cost, labels, reg_e, reg_g, outer_iter=outer_iter, inner_iter=inner_iter,
        stop_thr=stop_thr, tol=tol, warm_start=warm_start,
    )  # fmt: skip


def group_lasso_fast(
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
    inner_tol: float | None = None,
    start: fast.SinkhornState | None = None,
    threads: int | None = None,
    workspace: fast.Workspace | None = None,
) -> OTResult:
    """The group-lasso problem by this package's blocked solver (``dpda.ot.fast``), in float32.

    Parameters
    ----------
    a, b : numpy.ndarray
        Source (n,) and target (m,) marginals, each summing to 1.
    cost : numpy.ndarray
        The (n, m) cost, already normalized.
    labels : numpy.ndarray
        The (n,) class of each source row.
    reg_e, reg_g : float
        Entropic and group-lasso strengths.
    outer_iter, inner_iter : int
        Conditional-gradient steps, and Sinkhorn iterations within each.
    stop_thr : float
        Relative change of the objective at which the outer loop stops.
    tol : float
        L1 marginal error under which the result reports ``converged``.
    warm_start : bool
        Start from the entropic plan (``False``: from ``a·bᵀ``, as POT's ``sinkhorn_l1l2_gl``).
    inner_tol : float, optional
        The L1 marginal error at which each inner Sinkhorn solve stops (default
        ``dpda.ot.fast.INNER_TOL``, 1e-5: a hundredth of ``tol``; the plan is a convex
        combination of the inner plans, so its own marginal error stays below the largest of
        theirs, and ``tol / 4`` still reports ``converged``).
    start : dpda.ot.fast.SinkhornState, optional
        The ``start_state`` of an earlier result with the same target rows and marginal, in
        this ``cost``'s units: a warm start for the first solve (the plan is the same fixed
        point).
    threads : int, optional
        Threads for the passes over the plan (default: the BLAS threads in effect).
    workspace : dpda.ot.fast.Workspace, optional
        Buffers reused from solve to solve; the plan is then valid until its next solve.
    """
    _check_inputs(a, b, cost)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan, info = fast.group_lasso(
            a,
            b,
            cost,
            one_hot(np.asarray(labels)),
            reg_e,
            reg_g,
            outer_iter=outer_iter,
            inner_iter=inner_iter,
            stop_thr=stop_thr,
            inner_stop_thr=fast.INNER_TOL if inner_tol is None else inner_tol,
            warm_start=warm_start,
            start=start,
            threads=threads,
            workspace=workspace,
        )
    return _finish(plan, a, b, cost, info.outer, caught, tol, info)


def group_lasso_pot(
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
    """The group-lasso problem by POT's ``ot.optim.gcg``, in float64: the reference the fast
    engine is checked against.

    Parameters
    ----------
    a, b, cost, labels, reg_e, reg_g, outer_iter, inner_iter, stop_thr, tol
        As for ``group_lasso_fast`` (``stop_thr`` is POT's).
    warm_start : bool
        Start from the entropic plan rather than POT's default ``a·bᵀ``: every iterate is then a
        convex combination of plans that respect masked (forbidden) entries exactly.
    """
    _check_inputs(a, b, cost)
    f, df = group_lasso_terms(one_hot(np.asarray(labels)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
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
