"""Passes over an ``n × m`` plan a block of rows at a time, each block held in cache while every
operation on it runs: how the group-lasso solver (``fast.group_lasso``) reads each array once per
pass, and counts what it reads.

* **Kernel build** (``build_kernel``): the linearized cost ``Mᵢ = C + λg∇Ω(G)`` (``∇Ω`` is ``G``
  times a ``(q, m)`` table gathered by each row's label), shifted by column potentials ``β`` and
  then by each row's minimum (the c-transform, so every row keeps an entry of 1), exponentiated
  in place. It reads ``C`` and ``G`` once. A pending step ``G ← G + αΔ`` (``Δ`` still in the
  kernel's buffer) is applied in the same pass, so it costs no pass of its own.
* **Sinkhorn sweep** (``sweep``): one Sinkhorn–Knopp iteration in one pass: for each block,
  ``u = a / Kv`` and then ``Kᵀu`` accumulated while the block is still in cache (an iteration of
  ``u = a/Kv, v = b/Kᵀu`` otherwise reads the kernel twice).
* **Direction** (``direction``): the plan ``u∘K∘v``, ``Δ = plan − G`` written over the kernel,
  and the line search's sums ``⟨C,Δ⟩``, ``Yᵀ(G∘Δ)``, ``Yᵀ(Δ∘Δ)`` in one pass over ``K, G, C``.
* **Summary** (``summary``): row and column sums, ``⟨C,G⟩`` and ``Yᵀ G`` of the final plan.

Rows are cut into ``SPANS`` spans, each with its own accumulators, run on ``threads`` Python
threads (numpy releases the GIL; the solver holds BLAS to one thread per caller meanwhile): the
result does not depend on the number of threads.

A ``Tally`` counts, as the passes run, kernel builds, passes over the kernel (one per Sinkhorn
iteration) and every byte of an ``n × m`` array read; the solve reports it as a
``dpda.ot.traffic.Traffic``. ``bytes_read / (passes · nm · itemsize)`` is how much the solve
reads beyond what its Sinkhorn iterations must.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpda.ot.traffic import Traffic

BLOCK_ELEMS = 1 << 19  # elements per block: 2 MB of float32, held in cache between operations
# row spans, each with its own accumulators, whatever the number of threads that run them: the
# sums, so the plan, are then the same bit for bit on one thread or several
SPANS = 4
_UNDERFLOW = 1e-30  # a kernel column whose largest entry is below this is shifted back up


@dataclass
class Tally:
    """What a solve's passes did so far, counted as they run (``traffic()``: the value)."""

    kernel_builds: int = 0
    passes: int = 0
    bytes_read: int = 0

    def traffic(self) -> Traffic:
        return Traffic(self.kernel_builds, self.passes, self.bytes_read)


@dataclass(frozen=True)
class Rows:
    """How rows are split: blocks of ``rows`` rows within ``threads`` contiguous spans."""

    n: int
    rows: int
    threads: int
    labels: np.ndarray  # (n,) int64 class of each row

    def spans(self) -> list[tuple[int, int]]:
        bounds = np.linspace(0, self.n, min(SPANS, self.n) + 1).round().astype(int)
        return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]

    def blocks(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """``(i, j, label)`` blocks of ``[lo, hi)``, also split wherever the label changes, so
        every block has one label (rows sorted by label, as the solver keeps them, split only at
        the few class boundaries)."""
        out = []
        for i in range(lo, hi, self.rows):
            j = min(i + self.rows, hi)
            cuts = np.flatnonzero(np.diff(self.labels[i:j])) + i + 1
            if cuts.size == 0:
                out.append((i, j, int(self.labels[i])))
                continue
            edges = [i, *cuts.tolist(), j]
            out.extend(
                (s, e, int(self.labels[s])) for s, e in zip(edges[:-1], edges[1:], strict=True)
            )
        return out


def _classes(layout: Rows, lo: int, hi: int) -> tuple[int, int]:
    """The classes of rows ``[lo, hi)`` (sorted by label): ``(first, count)``. A span's
    ``(q, m)`` accumulators cover only these rows of the table, so the spans together hold
    about ``(n + SPANS) × m`` entries, not ``SPANS × q × m`` (with one point a class, as many
    as the plan's own)."""
    if hi <= lo:
        return 0, 0
    first = int(layout.labels[lo])
    return first, int(layout.labels[hi - 1]) - first + 1


def _gather(parts: list[tuple[int, np.ndarray]], n_classes: int, m: int) -> np.ndarray:
    """The ``(q, m)`` sum of the spans' partial tables, each at its classes' rows, added in
    span order (the same sums as adding whole tables with zeros elsewhere)."""
    out = np.zeros((n_classes, m))
    for first, table in parts:
        out[first : first + table.shape[0]] += table
    return out


def rows_for(n: int, m: int, threads: int, labels: np.ndarray) -> Rows:
    return Rows(n, max(1, BLOCK_ELEMS // max(m, 1)), max(1, min(threads, n)), labels)


def _run(
    pool: ThreadPoolExecutor | None, spans: list[tuple[int, int]], fn: Callable[[int, int], Any]
) -> list[Any]:
    if pool is None or len(spans) == 1:
        return [fn(lo, hi) for lo, hi in spans]
    return list(pool.map(lambda s: fn(*s), spans))


def build_kernel(
    k: np.ndarray,
    c: np.ndarray,
    reg: float,
    shift: np.ndarray,
    layout: Rows,
    pool: ThreadPoolExecutor | None,
    traffic: Tally,
    g: np.ndarray | None = None,
    table: np.ndarray | None = None,
    alpha: float | None = None,
) -> np.ndarray:
    """Write ``exp(−(Mᵢ − r_i − shift_j)/reg)`` into ``k`` (``Mᵢ = C + table[label]∘G``, or ``C``);
    return ``r`` (n,) float64. ``alpha``: first ``G += alpha·k`` (``k`` holds ``Δ``). Columns whose
    entries all underflow have ``shift`` raised in place (a column of ``Mᵢ`` read on its own)."""
    dtype = k.dtype
    n, m = k.shape
    r = np.empty(n)
    sh = shift.astype(dtype)
    scale = dtype.type(-1.0 / reg)

    def part(lo: int, hi: int) -> np.ndarray:
        colmax = np.zeros(m, dtype=dtype)
        for i, j, lab in layout.blocks(lo, hi):
            kb = k[i:j]
            if g is not None and table is not None:
                gb = g[i:j]
                if alpha is not None:
                    kb *= dtype.type(alpha)
                    gb += kb
                np.multiply(gb, table[lab], out=kb)
                kb += c[i:j]
            else:
                np.copyto(kb, c[i:j])
            kb -= sh
            rb = kb.min(axis=1)
            r[i:j] = rb
            kb -= rb[:, None]
            kb *= scale
            np.exp(kb, out=kb)
            np.maximum(colmax, kb.max(axis=0), out=colmax)
        return colmax

    colmax = np.max(_run(pool, layout.spans(), part), axis=0)
    traffic.kernel_builds += 1
    traffic.bytes_read += c.nbytes * (1 if g is None else 2 + (alpha is not None))
    for j in np.flatnonzero(colmax < _UNDERFLOW):  # rare: only where Mᵢ − β leaves a column out
        col = c[:, j].astype(np.float64) - r
        if g is not None and table is not None:
            col += table[layout.labels, j] * g[:, j]
        low = float((col - shift[j]).min())
        shift[j] += low
        k[:, j] = np.exp((col - shift[j]) * (-1.0 / reg)).astype(dtype)
    return r


def _gemv(dtype: np.dtype) -> Callable[..., np.ndarray]:
    from scipy.linalg import blas

    fn: Callable[..., np.ndarray] = blas.sgemv if dtype == np.float32 else blas.dgemv
    return fn


def sweep(
    k: np.ndarray,
    a: np.ndarray,
    v: np.ndarray,
    u: np.ndarray,
    layout: Rows,
    pool: ThreadPoolExecutor | None,
    traffic: Tally,
) -> np.ndarray:
    """One pass: ``u = a / Kv`` (into ``u``), then return ``Kᵀu``."""
    tiny = np.finfo(k.dtype).tiny
    gemv = _gemv(k.dtype)

    def part(lo: int, hi: int) -> np.ndarray:
        acc = np.zeros(k.shape[1], dtype=k.dtype)
        for i in range(lo, hi, layout.rows):
            j = min(i + layout.rows, hi)
            kt = k[i:j].T  # Fortran order: BLAS reads the block in place
            kv = gemv(1.0, kt, v, trans=1)
            np.maximum(kv, tiny, out=kv)
            np.divide(a[i:j], kv, out=u[i:j])
            # acc += Kᵀu accumulated by BLAS itself (no temporary of m entries per block)
            acc = gemv(1.0, kt, u[i:j], beta=1.0, y=acc, overwrite_y=1)
        return acc

    parts = _run(pool, layout.spans(), part)
    traffic.passes += 1
    traffic.bytes_read += k.nbytes
    out: np.ndarray = parts[0] if len(parts) == 1 else np.sum(parts, axis=0)
    return out


def direction(
    k: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    g: np.ndarray,
    c: np.ndarray,
    n_classes: int,
    layout: Rows,
    pool: ThreadPoolExecutor | None,
    traffic: Tally,
) -> tuple[float, np.ndarray, np.ndarray]:
    """Overwrite ``k`` with ``Δ = u∘K∘v − G``; return ``⟨C,Δ⟩``, ``Yᵀ(G∘Δ)``, ``Yᵀ(Δ∘Δ)``."""
    m = k.shape[1]

    def part(lo: int, hi: int) -> tuple[float, int, np.ndarray, np.ndarray]:
        c_d = 0.0
        first, count = _classes(layout, lo, hi)
        sq_b = np.zeros((count, m))
        sq_d = np.zeros((count, m))
        tmp = np.empty((layout.rows, m), dtype=k.dtype)
        col = np.empty(m, dtype=k.dtype)  # a block's column sums, added into float64
        for i, j, lab in layout.blocks(lo, hi):
            kb, gb, t = k[i:j], g[i:j], tmp[: j - i]
            kb *= u[i:j, None]
            kb *= v
            kb -= gb
            c_d += float(np.dot(c[i:j].reshape(-1), kb.reshape(-1)))
            np.multiply(gb, kb, out=t)
            np.add.reduce(t, axis=0, out=col)
            sq_b[lab - first] += col
            np.multiply(kb, kb, out=t)
            np.add.reduce(t, axis=0, out=col)
            sq_d[lab - first] += col
        return c_d, first, sq_b, sq_d

    parts = _run(pool, layout.spans(), part)
    traffic.bytes_read += 3 * k.nbytes
    return (
        sum(p[0] for p in parts),
        _gather([(p[1], p[2]) for p in parts], n_classes, m),
        _gather([(p[1], p[3]) for p in parts], n_classes, m),
    )


def step(
    g: np.ndarray,
    delta: np.ndarray,
    alpha: float,
    layout: Rows,
    pool: ThreadPoolExecutor | None,
    traffic: Tally,
) -> None:
    """``G += alpha·Δ`` (``Δ`` scaled in place)."""

    def part(lo: int, hi: int) -> None:
        for i in range(lo, hi, layout.rows):
            j = min(i + layout.rows, hi)
            db = delta[i:j]
            db *= g.dtype.type(alpha)
            g[i:j] += db

    _run(pool, layout.spans(), part)
    traffic.bytes_read += 2 * g.nbytes


def plan(
    k: np.ndarray,
    u: np.ndarray,
    v: np.ndarray,
    layout: Rows,
    pool: ThreadPoolExecutor | None,
    traffic: Tally,
) -> None:
    """Overwrite ``k`` with the plan ``u∘K∘v``."""

    def part(lo: int, hi: int) -> None:
        for i in range(lo, hi, layout.rows):
            j = min(i + layout.rows, hi)
            kb = k[i:j]
            kb *= u[i:j, None]
            kb *= v

    _run(pool, layout.spans(), part)
    traffic.bytes_read += k.nbytes


@dataclass(frozen=True)
class Summary:
    rows: np.ndarray  # (n,) γ1, float64
    cols: np.ndarray  # (m,) γᵀ1, float64
    cost: float  # ⟨C, γ⟩
    class_mass: np.ndarray  # (q, m) Yᵀγ, float64


def squares(
    g: np.ndarray, n_classes: int, layout: Rows, pool: ThreadPoolExecutor | None, traffic: Tally
) -> np.ndarray:
    """``Yᵀ(G∘G)`` (q, m), float64."""
    m = g.shape[1]

    def part(lo: int, hi: int) -> tuple[int, np.ndarray]:
        first, count = _classes(layout, lo, hi)
        sq = np.zeros((count, m))
        tmp = np.empty((layout.rows, m), dtype=g.dtype)
        for i, j, lab in layout.blocks(lo, hi):
            t = tmp[: j - i]
            np.multiply(g[i:j], g[i:j], out=t)
            sq[lab - first] += t.sum(axis=0)
        return first, sq

    traffic.bytes_read += g.nbytes
    return _gather(_run(pool, layout.spans(), part), n_classes, m)


def summary(
    g: np.ndarray,
    c: np.ndarray,
    n_classes: int,
    layout: Rows,
    pool: ThreadPoolExecutor | None,
    traffic: Tally,
) -> Summary:
    n, m = g.shape
    rows = np.empty(n)

    def part(lo: int, hi: int) -> tuple[np.ndarray, float, int, np.ndarray]:
        cols = np.zeros(m)
        first, count = _classes(layout, lo, hi)
        mass = np.zeros((count, m))
        dot = 0.0
        for i, j, lab in layout.blocks(lo, hi):
            gb = g[i:j]
            rows[i:j] = gb.sum(axis=1, dtype=np.float64)
            s = gb.sum(axis=0, dtype=np.float64)
            cols += s
            mass[lab - first] += s
            dot += float(np.dot(c[i:j].reshape(-1), gb.reshape(-1)))
        return cols, dot, first, mass

    parts = _run(pool, layout.spans(), part)
    traffic.bytes_read += 2 * g.nbytes
    return Summary(
        rows=rows,
        cols=np.sum([p[0] for p in parts], axis=0),
        cost=sum(p[1] for p in parts),
        class_mass=_gather([(p[2], p[3]) for p in parts], n_classes, m),
    )
