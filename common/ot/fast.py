"""Lean Sinkhorn and entropic + group-lasso solvers: float32, in place, warm-started.

The same algorithms as POT's ``ot.sinkhorn`` and ``ot.optim.gcg`` (which
``ot.da.sinkhorn_l1l2_gl`` calls), arranged so that an ``n × m`` problem touches three ``n × m``
buffers and each Sinkhorn iteration reads the kernel twice and nothing else:

* **Sinkhorn.** ``u = a / Kv``, ``v = b / Kᵀu``. The column-marginal error of the current plan is
  ``‖v∘(Kᵀu) − b‖₁``, a by-product of the ``v`` update, so the stopping test is free (POT spends a
  third pass over the kernel on it every ten iterations). The kernel is built from the cost shifted
  by its row minima, then column minima — the shifts fold into ``u`` and ``v`` — so no row or column
  of the kernel underflows to zero in float32.
* **Conditional gradient.** At each outer step the linearized cost is ``Mᵢ = C + λg∇Ω(G)`` and the
  direction is the entropic plan on ``Mᵢ`` (exactly POT's ``gcg``). Sinkhorn is warm-started from
  the previous step's dual potentials, so after the first solve it needs a few tens of iterations
  instead of hundreds.
* **Line search.** Along ``G + αΔ`` the objective ``⟨C,G⟩ + λgΩ(G)`` is
  ``⟨C,G⟩ + α⟨C,Δ⟩ + λg Σ_{c,j} √(A + 2αB + α²D)`` with ``A, B, D`` the per-class, per-column sums
  of ``G∘G``, ``G∘Δ``, ``Δ∘Δ`` (``q × m`` each). They are computed once per step, so the Armijo
  search (POT's, same constants) costs ``O(qm)`` per trial instead of a pass over ``n × m``.

Inner products over ``n × m`` arrays are accumulated in float64, a block of rows at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from ot.optim import scalar_search_armijo

_EPS_NORM = 1e-12
_CHUNK = 1 << 17  # elements per BLAS dot in dot64: a few hundred KB
_PRODUCT_BLOCK = 1 << 21  # elements per block of Yᵀ(x∘z): 8 MB of float32 temporaries
_ABS_STOP = 1e-9  # POT gcg's stopThr2


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
    """POT's Armijo search (same constants) on ``φ(α)``, α clipped to [0, 1]; ``O(qm)`` a trial."""

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
    inner_stop_thr: float = 1e-6,
    warm_start: bool = True,
    dtype: type = np.float32,
) -> tuple[np.ndarray, SolveInfo]:
    """``min ⟨γ,C⟩ + λe Σγlogγ + λg Σ_j Σ_c ‖γ(I_c,j)‖₂`` by conditional gradient.

    ``y (n, q)`` one-hot labels. ``warm_start`` starts from the entropic plan of ``C`` (every
    iterate then keeps the zeros of masked entries); otherwise from ``a·bᵀ`` as POT does.
    ``stop_thr`` is the relative objective change that ends the outer loop (POT's ``stopThr``).
    """
    n, m = cost.shape
    # read only: a C-contiguous cost in the working precision is used as it is, not copied
    c: np.ndarray = np.ascontiguousarray(cost, dtype=dtype)
    yd: np.ndarray = np.asarray(y, dtype=dtype)
    inner: list[int] = []
    work: np.ndarray = np.empty((n, m), dtype=dtype)

    if warm_start:
        np.copyto(work, c)
        r, s = kernel_inplace(work, reg_e)
        u, v, it, err = sinkhorn_scalings(work, a, b, np.ones(m), inner_iter, inner_stop_thr)
        inner.append(it)
        state: SinkhornState | None = _state(u, v, r, s, reg_e)
        g = plan_inplace(work, u, v)
        work = np.empty((n, m), dtype=dtype)
    else:
        g = np.outer(a, b).astype(dtype)
        state = None
        err = float("nan")

    rows = max(1, _PRODUCT_BLOCK // max(m, 1))
    tmp = np.empty((min(rows, n), m), dtype=dtype)

    def sq_norms(x: np.ndarray, z: np.ndarray) -> np.ndarray:
        """``Yᵀ(x∘z)`` (q, m), a block of rows (a few MB, held in the last-level cache) at a
        time; measured fastest among row, column and whole-array variants."""
        out = np.zeros((yd.shape[1], m))
        for i in range(0, n, rows):
            k = min(rows, n - i)
            np.multiply(x[i : i + k], z[i : i + k], out=tmp[:k])
            out += yd[i : i + k].T @ tmp[:k]
        return out

    sq = sq_norms(g, g)
    c_g = dot64(c, g)
    loss = c_g + reg_g * float(np.sqrt(sq).sum())
    outer = 0
    while outer < outer_iter:
        outer += 1
        norms = np.sqrt(sq)
        scaled_inv = (reg_g / np.maximum(norms, _EPS_NORM)).astype(dtype)
        # Mi = C + λg·∇Ω(G), ∇Ω(G)_ij = G_ij / ‖G(I_c(i), j)‖
        np.matmul(yd, scaled_inv, out=work)
        work *= g
        work += c
        r, s = kernel_inplace(work, reg_e)
        v0 = _scalings_from_state(state, s, reg_e, m)
        u, v, it, err = sinkhorn_scalings(work, a, b, v0, inner_iter, inner_stop_thr)
        inner.append(it)
        state = _state(u, v, r, s, reg_e)
        delta = plan_inplace(work, u, v)
        delta -= g  # Δ = Gc − G
        # line search on φ(α) = ⟨C,G⟩ + α⟨C,Δ⟩ + λg Σ √(A + 2αB + α²D)
        c_d = dot64(c, delta)
        sq_b = sq_norms(g, delta)
        sq_d = sq_norms(delta, delta)
        derphi0 = c_d + reg_g * float((sq_b / np.maximum(norms, _EPS_NORM)).sum())

        alpha, new_loss = _line_search(loss, derphi0, c_g, c_d, sq, sq_b, sq_d, reg_g)
        delta *= alpha
        g += delta
        sq = np.maximum(sq + 2.0 * alpha * sq_b + alpha * alpha * sq_d, 0.0)
        c_g = c_g + alpha * c_d
        old, loss = loss, float(new_loss)
        if abs(loss - old) < stop_thr * abs(loss) or abs(loss - old) < _ABS_STOP:
            break
    marginal = max(
        float(np.abs(g.sum(axis=1, dtype=np.float64) - a).sum()),
        float(np.abs(g.sum(axis=0, dtype=np.float64) - b).sum()),
    )
    return g, SolveInfo(outer=outer, inner=inner, marginal_error=marginal)
