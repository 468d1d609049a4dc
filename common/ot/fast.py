"""Lean Sinkhorn and entropic + group-lasso solvers: float32, in place, warm-started.

The same algorithms as POT's ``ot.sinkhorn`` and ``ot.optim.gcg`` (which
``ot.da.sinkhorn_l1l2_gl`` calls), arranged so that an ``n × m`` problem touches three ``n × m``
buffers (the cost, the kernel, the plan) and reads each as few times as it can:

* **Sinkhorn.** ``u = a / Kv``, ``v = b / Kᵀu``. The column-marginal error of the current plan is
  ``‖v∘(Kᵀu) − b‖₁``, a by-product of the ``v`` update, so the stopping test is free (POT spends a
  third pass over the kernel on it every ten iterations). ``sinkhorn`` builds the kernel from the
  cost shifted by its row minima, then column minima — the shifts fold into ``u`` and ``v`` — so no
  row or column of the kernel underflows to zero in float32.
* **Conditional gradient** (``group_lasso``). At each outer step the linearized cost is
  ``Mᵢ = C + λg∇Ω(G)`` and the direction is the entropic plan on ``Mᵢ`` (exactly POT's ``gcg``).
  Its kernel is built in one blocked pass over ``C`` and ``G`` with the previous step's column
  potentials absorbed into it (then each row's c-transform), so Sinkhorn starts at ``v = 1`` a
  few iterations from its fixed point, and each Sinkhorn iteration is one pass over the kernel
  (``dpda.ot._blocked``: a block of rows stays in cache for ``Kv`` and ``Kᵀu``). The first solve
  can start from another problem's potentials (``start``: an earlier minibatch onto the same
  target rows). Each inner solve stops at ``inner_stop_thr``, the plan's own marginal error.
* **Line search.** Along ``G + αΔ`` the objective ``⟨C,G⟩ + λgΩ(G)`` is
  ``⟨C,G⟩ + α⟨C,Δ⟩ + λg Σ_{c,j} √(A + 2αB + α²D)`` with ``A, B, D`` the per-class, per-column sums
  of ``G∘G``, ``G∘Δ``, ``Δ∘Δ`` (``q × m`` each). ``B``, ``D`` and ``⟨C,Δ⟩`` come from the pass that
  writes ``Δ``; ``A`` and ``⟨C,G⟩`` are updated from them, so the Armijo search (POT's, same
  constants) costs ``O(qm)`` per trial, and the step ``G += αΔ`` is taken in the next kernel build.

``SolveInfo.traffic`` counts the kernel builds, the passes over the kernel and the bytes of
``n × m`` arrays read. Inner products over ``n × m`` arrays are accumulated in float64, a block of
rows at a time.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from dpda.ot import _blocked
from dpda.ot._blocked import Tally
from dpda.ot.traffic import Traffic

_EPS_NORM = 1e-12
_CHUNK = 1 << 17  # elements per BLAS dot in dot64: a few hundred KB
_PRODUCT_BLOCK = 1 << 21  # elements per block of Yᵀ(x∘z): 8 MB of float32 temporaries
_ABS_STOP = 1e-9  # POT gcg's stopThr2
# plan cells (rows × columns) below which a solve runs its passes in the calling thread
POOL_MIN_CELLS = 1 << 16
# the group-lasso solve's inner Sinkhorn tolerance (L1 marginal error) by default: a hundredth
# of the tolerance at which a plan reports converged (docs/results.md#constants)
INNER_TOL = 1e-5
_SETTLE = 10.0  # the outer loop stops when its last two changes are below stop_thr·(10, 1)


class Workspace:
    """Reusable ``n × m`` buffers for a sequence of solves of one shape (a job's minibatches).

    A fresh buffer of a few hundred MB costs its page faults on first touch, often more than a
    pass over it; a workspace hands the same buffers to the next solve instead. An array taken
    from it is valid until the same name is taken again: the caller of a solve that uses a
    workspace must be done with the plan (and a cost built in it) before the next solve. One
    workspace per thread."""

    HEADROOM = 1.1  # a new buffer holds this much more than asked (batch sizes vary)

    def __init__(self) -> None:
        self._flat: dict[str, np.ndarray] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        """An uninitialised C-contiguous array ``name`` of ``shape`` and ``dtype``: a view of
        the last buffer of that name when it is large enough, else of a new one (which
        replaces it)."""
        size = int(np.prod(shape))
        flat = self._flat.get(name)
        if flat is None or flat.dtype != np.dtype(dtype) or flat.size < size:
            self._flat.pop(name, None)  # the old buffer goes before the new one is made
            flat = np.empty(max(1, int(size * self.HEADROOM)), dtype=dtype)
            self._flat[name] = flat
        return flat[:size].reshape(shape)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in self._flat.values())


@dataclass
class SinkhornState:
    """Dual potentials ``α (n,)``, ``β (m,)`` in cost units: plan ``exp((α_i+β_j−C_ij)/λ)``."""

    alpha: np.ndarray
    beta: np.ndarray


def dot64(x: np.ndarray, y: np.ndarray) -> float:
    """``Σ x∘y`` without an ``n × m`` temporary: BLAS dot products over cache-sized blocks,
    summed in float64 (float32 inputs are not cast as a whole)."""
    if x.shape != y.shape:
        raise ValueError("dot64: shapes differ")
    if x.dtype != y.dtype:
        dt = np.result_type(x, y)
        x, y = x.astype(dt, copy=False), y.astype(dt, copy=False)
    xr = np.ascontiguousarray(x).reshape(-1)
    yr = np.ascontiguousarray(y).reshape(-1)
    total = 0.0
    for i in range(0, xr.size, _CHUNK):
        total += float(np.dot(xr[i : i + _CHUNK], yr[i : i + _CHUNK]))
    return total


def kernel_inplace(mi: np.ndarray, reg: float) -> tuple[np.ndarray, np.ndarray]:
    """Overwrite ``mi`` with ``exp(−(mi − r_i − s_j)/reg)``; return the shifts ``r``, ``s``."""
    r = mi.min(axis=1)
    mi -= r[:, None]
    s = mi.min(axis=0)
    mi -= s[None, :]
    mi *= -1.0 / reg
    np.exp(mi, out=mi)
    return r.astype(np.float64), s.astype(np.float64)


def sinkhorn_scalings(
    k: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    v: np.ndarray,
    max_iter: int,
    stop_thr: float,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Sinkhorn–Knopp from scaling ``v``: returns ``u, v, iterations, column-marginal L1 error``."""
    dtype = k.dtype
    a = a.astype(dtype)
    b = b.astype(dtype)
    v = v.astype(dtype)
    tiny = np.finfo(dtype).tiny
    err = np.inf
    done = 0
    u = a
    while done < max_iter:
        done += 1
        kv = k @ v
        u = a / np.maximum(kv, tiny)
        ktu = k.T @ u
        err = float(np.abs(v * ktu - b).sum(dtype=np.float64))
        v = b / np.maximum(ktu, tiny)
        if err < stop_thr:
            break
    return u, v, done, err


def _scalings_from_state(
    state: SinkhornState | None, s: np.ndarray, reg: float, m: int
) -> np.ndarray:
    if state is None:
        return np.ones(m)
    # v_j = exp((β_j − s_j)/λ); a common factor cancels in the first u update
    e = (state.beta - s) / reg
    out: np.ndarray = np.exp(np.clip(e - e.max(), -80.0, 0.0))
    return out


def _state(u: np.ndarray, v: np.ndarray, r: np.ndarray, s: np.ndarray, reg: float) -> SinkhornState:
    tiny = 1e-300
    return SinkhornState(
        alpha=r + reg * np.log(np.maximum(u.astype(np.float64), tiny)),
        beta=s + reg * np.log(np.maximum(v.astype(np.float64), tiny)),
    )


def plan_inplace(k: np.ndarray, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    k *= u[:, None]
    k *= v[None, :]
    return k


def _line_search(
    loss: float,
    derphi0: float,
    c_g: float,
    c_d: float,
    sq: np.ndarray,
    sq_b: np.ndarray,
    sq_d: np.ndarray,
    reg_g: float,
) -> tuple[float, float]:
    """POT's Armijo search (same constants) on ``φ(α)``, α clipped to [0, 1]; ``O(qm)`` a trial.
    POT is imported here, on a solve, so that a process that never solves (a source that only
    plans, a command that reads a ledger) does not load it."""
    from ot.optim import scalar_search_armijo

    def phi(alpha: float) -> float:
        alpha = float(np.clip(alpha, 0.0, 1.0))
        q = np.maximum(sq + 2.0 * alpha * sq_b + alpha * alpha * sq_d, 0.0)
        return c_g + alpha * c_d + reg_g * float(np.sqrt(q).sum())

    alpha, new_loss = scalar_search_armijo(phi, loss, derphi0, c1=1e-4, alpha0=0.99, amin=0.0)
    if alpha is None:
        return 0.0, loss
    return float(np.clip(alpha, 0.0, 1.0)), float(new_loss)


@dataclass
class SolveInfo:
    outer: int
    inner: list[int]
    marginal_error: float
    traffic: Traffic = field(default_factory=Traffic)
    # the dual potentials of the first entropic solve (the plan of ``C`` alone): a warm start
    # for the next problem with the same target marginal and target rows
    start_state: SinkhornState | None = None
    rows: np.ndarray | None = None  # (n,) γ1 of the returned plan, float64
    cols: np.ndarray | None = None  # (m,) γᵀ1
    cost: float | None = None  # ⟨C, γ⟩
    class_mass: np.ndarray | None = None  # (q, m) Yᵀγ


def sinkhorn(
    a: np.ndarray,
    b: np.ndarray,
    cost: np.ndarray,
    reg: float,
    *,
    max_iter: int = 1000,
    stop_thr: float = 1e-6,
    dtype: type = np.float32,
) -> tuple[np.ndarray, SolveInfo]:
    """Entropic OT plan ``(n, m)`` in ``dtype``; ``stop_thr``: column-marginal L1 error."""
    k: np.ndarray = np.array(cost, dtype=dtype, copy=True)
    kernel_inplace(k, reg)
    u, v, it, err = sinkhorn_scalings(k, a, b, np.ones(b.size), max_iter, stop_thr)
    return plan_inplace(k, u, v), SolveInfo(outer=0, inner=[it], marginal_error=err)


def solver_threads() -> int:
    """Threads a solve's passes use: the BLAS threads in effect (one on a Dask worker, whose
    BLAS is held to one thread), else the machine's cores."""
    from threadpoolctl import threadpool_info

    counts = [
        int(p.get("num_threads") or 1) for p in threadpool_info() if p.get("user_api") == "blas"
    ]
    return max(1, min(counts) if counts else (os.cpu_count() or 1))


def _scalings(
    k: np.ndarray,
    a: np.ndarray,
    b: np.ndarray,
    layout: _blocked.Rows,
    pool: ThreadPoolExecutor | None,
    traffic: Tally,
    max_iter: int,
    stop_thr: float,
) -> tuple[np.ndarray, np.ndarray, int, float]:
    """Sinkhorn–Knopp from ``v = 1`` (the kernel's shifts hold the warm start), one pass an
    iteration; stops when the plan's column-marginal L1 error is below ``stop_thr``."""
    tiny = np.finfo(k.dtype).tiny
    v = np.ones(k.shape[1], dtype=k.dtype)
    u = np.empty(k.shape[0], dtype=k.dtype)
    err = np.inf
    done = 0
    while done < max_iter:
        done += 1
        ktu = _blocked.sweep(k, a, v, u, layout, pool, traffic)
        err = float(np.abs(v * ktu - b).sum(dtype=np.float64))
        v = b / np.maximum(ktu, tiny)
        if err < stop_thr:
            break
    return u, v, done, err


def group_lasso(
    a: np.ndarray,
    b: np.ndarray,
    cost: np.ndarray,
    y: np.ndarray,
    reg_e: float,
    reg_g: float,
    *,
    outer_iter: int = 10,
    inner_iter: int = 200,
    stop_thr: float = 1e-9,
    inner_stop_thr: float = INNER_TOL,
    warm_start: bool = True,
    dtype: type = np.float32,
    start: SinkhornState | None = None,
    threads: int | None = None,
    workspace: Workspace | None = None,
) -> tuple[np.ndarray, SolveInfo]:
    """``min ⟨γ,C⟩ + λe Σγlogγ + λg Σ_j Σ_c ‖γ(I_c,j)‖₂`` by conditional gradient.

    ``y (n, q)`` one-hot labels. ``warm_start`` starts from the entropic plan of ``C`` (every
    iterate then keeps the zeros of masked entries); otherwise from ``a·bᵀ`` as POT does.
    ``stop_thr`` is the relative objective change that ends the outer loop (POT's ``stopThr``),
    once the step before it changed the objective by less than ``_SETTLE`` times that too.
    ``start``: dual potentials of an earlier problem with the same target rows and marginal
    (``SolveInfo.start_state`` of the previous minibatch), the warm start of the first entropic
    solve; only its ``beta`` is used. ``threads``: threads for the passes (default
    ``solver_threads()``). ``workspace``: where the kernel and the plan live (the returned plan
    is then one of its buffers, valid until its next solve); default: new arrays.

    Two ``n × m`` buffers besides the cost: the kernel (then the direction ``Δ``) and the plan.
    Every pass is blocked (``dpda.ot._blocked``) and counted in ``SolveInfo.traffic``.
    """
    from threadpoolctl import threadpool_limits

    n, m = cost.shape
    yd = np.asarray(y)
    q = yd.shape[1]
    labels = yd.argmax(axis=1).astype(np.int64)
    # rows are solved sorted by label (each block of rows then has one label); rows given in
    # another order are sorted here and the plan's rows put back in the caller's order
    order = np.argsort(labels, kind="stable") if np.any(np.diff(labels) < 0) else None
    if order is None:
        c: np.ndarray = np.ascontiguousarray(cost, dtype=dtype)
    else:
        c = np.take(np.asarray(cost), order, axis=0).astype(dtype, copy=False)
        labels, a = labels[order], np.asarray(a)[order]
    threads = solver_threads() if threads is None else max(1, threads)
    layout = _blocked.rows_for(n, m, threads, labels)
    traffic = Tally()
    a_d: np.ndarray = a.astype(dtype)
    b_d: np.ndarray = b.astype(dtype)
    inner: list[int] = []
    ws = Workspace() if workspace is None else workspace
    k: np.ndarray = ws.array("first", (n, m), dtype)
    # the passes split into the same spans, summed in the same order, with or without threads;
    # below POOL_MIN_CELLS a pool's hand-offs cost more than the pass (a few class points)
    pool = (
        ThreadPoolExecutor(layout.threads)
        if layout.threads > 1 and n * m >= POOL_MIN_CELLS
        else None
    )
    limits = threadpool_limits(limits=1) if layout.threads > 1 else None
    try:
        start_state: SinkhornState | None = None
        if warm_start:
            shift = start.beta.copy() if start is not None else np.zeros(m)
            r = _blocked.build_kernel(k, c, reg_e, shift, layout, pool, traffic)
            u, v, it, err = _scalings(
                k, a_d, b_d, layout, pool, traffic, inner_iter, inner_stop_thr
            )
            inner.append(it)
            start_state = state = _state(u, v, r, shift, reg_e)
            _blocked.plan(k, u, v, layout, pool, traffic)
            g = k
            k = ws.array("second", (n, m), dtype)
        else:
            g = np.outer(a, b).astype(dtype)
            state = None
        sq = _blocked.squares(g, q, layout, pool, traffic)
        c_g = dot64(c, g)
        traffic.bytes_read += 2 * g.nbytes
        loss = c_g + reg_g * float(np.sqrt(sq).sum())
        pending: float | None = None  # a step G += αΔ not yet applied (Δ is in k)
        last_change = np.inf  # the previous outer step's relative change of the objective
        outer = 0
        while outer < outer_iter:
            outer += 1
            norms = np.sqrt(sq)
            # Mi = C + λg·∇Ω(G), ∇Ω(G)_ij = G_ij / ‖G(I_c(i), j)‖
            table = (reg_g / np.maximum(norms, _EPS_NORM)).astype(dtype)
            shift = state.beta.copy() if state is not None else np.zeros(m)
            r = _blocked.build_kernel(
                k, c, reg_e, shift, layout, pool, traffic, g=g, table=table, alpha=pending
            )
            pending = None
            u, v, it, err = _scalings(
                k, a_d, b_d, layout, pool, traffic, inner_iter, inner_stop_thr
            )
            inner.append(it)
            state = _state(u, v, r, shift, reg_e)
            c_d, sq_b, sq_d = _blocked.direction(k, u, v, g, c, q, layout, pool, traffic)
            # line search on φ(α) = ⟨C,G⟩ + α⟨C,Δ⟩ + λg Σ √(A + 2αB + α²D)
            derphi0 = c_d + reg_g * float((sq_b / np.maximum(norms, _EPS_NORM)).sum())
            alpha, new_loss = _line_search(loss, derphi0, c_g, c_d, sq, sq_b, sq_d, reg_g)
            sq = np.maximum(sq + 2.0 * alpha * sq_b + alpha * alpha * sq_d, 0.0)
            c_g = c_g + alpha * c_d
            pending = alpha
            old, loss = loss, float(new_loss)
            change = abs(loss - old) / max(abs(loss), 1e-300)
            # settled: this step's change is below stop_thr and the one before it below ten
            # times that (after a long step the line search often takes a short one, whose
            # small change is not convergence: the next step moves the objective again)
            settled = change < stop_thr and last_change < _SETTLE * stop_thr
            if settled or abs(loss - old) < _ABS_STOP:
                break
            last_change = change
        if pending is not None:
            _blocked.step(g, k, pending, layout, pool, traffic)
        del k
        done = _blocked.summary(g, c, q, layout, pool, traffic)
    finally:
        if limits is not None:
            limits.restore_original_limits()
        if pool is not None:
            pool.shutdown()
    marginal = max(float(np.abs(done.rows - a).sum()), float(np.abs(done.cols - b).sum()))
    rows = done.rows
    if order is not None:
        back = np.argsort(order)
        g, rows = g[back], rows[back]
        if start_state is not None:
            start_state = SinkhornState(start_state.alpha[back], start_state.beta)
    return g, SolveInfo(
        outer=outer,
        inner=inner,
        marginal_error=marginal,
        traffic=traffic.traffic(),
        start_state=start_state,
        rows=rows,
        cols=done.cols,
        cost=done.cost,
        class_mass=done.class_mass,
    )
