"""DP synthetic points through a Sinkhorn loss (DP-Sinkhorn), record unit.

What is trained. Per class ``c`` a set of ``m_c`` free synthetic points ``Y_c`` (rows in the
session's projected space) is fitted to the class's clipped projected rows ``x_i`` (``‖x_i‖ ≤ C``)
by descent on the semi-debiased Sinkhorn loss

    L(Y) = OT_λ(μ_c, ν_Y) − (p/2)·OT_λ(ν_Y, ν_Y),      c(x, y) = ‖x − y‖² / (2C²),

where ``μ_c`` is the class's empirical distribution, ``ν_Y`` the uniform measure on ``Y_c`` and
``p`` the debiasing ratio (0: plain entropic OT, 1: the Sinkhorn divergence).

Why the private part is written in its semi-dual form. The paper clips the gradient with respect
to each *generated* point and charges sensitivity 2Δ for it. That under-counts: the entropic
plan couples every real row with every generated point, so replacing one real row moves every
row of that gradient (the whole ``m × ℓ`` matrix moves by up to ``2Δ·√m``, not ``2Δ``; the test
``test_the_papers_per_point_clipping_undercounts`` exhibits a replacement that moves it by
more than 2Δ). Here the
privacy-carrying query is a sum over real rows instead. The semi-dual of entropic OT,

    OT_λ(μ, ν_Y) = max_g  Σ_j b_j g_j + E_{x∼μ}[ −λ log Σ_j b_j exp((g_j − c(x, y_j))/λ) ],

is an expectation over real rows, so its gradients in ``Y`` and in the potential ``g`` are sums
of per-record terms: record ``x`` contributes, with
``w(x) = softmax_j((g_j − c(x, y_j))/λ + log b_j)``,

    u(x) = [ w_j(x)·(y_j − x)/C  for every j ;  w(x) − b ]          (m·ℓ + m numbers).

Each ``u(x)`` is clipped to L2 norm 1 (DP-SGD's per-example clipping, on the real record) and
summed over the class; the sums of every class form one vector. Replace-one: a record replaced by
one of the same class moves one class block by ≤ 2, by one of another class two blocks by ≤ 1
each (≤ √2), so the L2 sensitivity is **2** whatever the peer sent. Gaussian noise
``N(0, (2σ)²)`` goes on every coordinate of that vector, at every step.

What is charged. ``T`` steps over the whole dataset (no subsampling, see below), each a Gaussian
mechanism of multiplier σ on a query chosen from public values and earlier noisy outputs: their
adaptive composition is exactly one Gaussian of multiplier σ/√T (Dong, Roth & Su 2019, Cor. 3.3),
which the ledger's accountant merges exactly (``SelfComposedDpEvent(Gaussian(σ), T)``). The class
counts come from the charged noisy histogram (discrete Laplace, as for prototypes); they set the
number of points per class and the normalisation of the gradients (post-processing).

Why no Poisson subsampling. The source discloses exact sizes, so every record-level release is
accounted under replace-one (``policy.PrivacyPolicy.neighbouring``). The ledger accounts every
event under add/remove with the replace-one factor 2 folded into the sensitivity
(``accounting``), which is exact for unsampled Gaussians but not a valid reading of a
Poisson-sampled one under replace-one; dp-accounting's RDP accountant refuses that event there,
and its PLD accountant (which has a replace-one mode) is not the relation the ledger composes
in. Until the ledger accounts sampled events under replace-one, the release takes full-batch
steps, which are exact. (At the few steps these releases take, amplification would buy little
anyway; that is an expectation, not a measurement.)

The part without private data. The debiasing term ``−(p/2)·OT_λ(ν_Y, ν_Y)`` touches synthetic
points only; its gradient comes from the project's fast Sinkhorn plan (``dpda.ot.fast``), is
clipped per point to the same scale (as in the paper) and gets no noise. Everything after the
noisy sums — the steps, the projection of each point onto the ball ``‖y‖ ≤ C``, the average of
the iterates over the second half of the run that is released — is post-processing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpda.dp.mechanisms import gaussian_noise
from dpda.ot import fast

# per-record gradient vectors are clipped to this L2 norm; replace-one sensitivity = 2 × it
GRADIENT_CLIP = 1.0
REPLACE_ONE_SENSITIVITY = 2.0 * GRADIENT_CLIP
# public initialisation: every class starts from the same small cloud around the origin
_INIT_SEED = 20021
_INIT_SCALE = 0.05


@dataclass(frozen=True)
class SinkhornSyntheticParams:
    """The public knobs of one run (all from the session terms)."""

    synthetic_points: int  # at most this many points per class, the term of the same name
    steps: int  # T noisy gradient steps
    reg: float  # λ on the cost ‖x − y‖²/(2C²)
    debias: float  # p in [0, 1]
    learning_rate: float  # η in (0, 1]
    clip_norm: float  # C: the rows' clipping norm (the ball the points stay in)
    rows_per_point: int = 1  # one point per this many noisy rows of the class


def points_per_class(noisy_counts: np.ndarray, per_class: int, rows_per_point: int) -> np.ndarray:
    """Points of each class from the charged noisy counts (both parties compute it): one per
    ``rows_per_point`` noisy rows, at least 1 and at most ``per_class``, for a class whose noisy
    count is ≥ 1; none otherwise (every class gets one if none reaches 1). Each point averages
    the gradients of about ``rows_per_point`` records, which sets its signal against the noise."""
    counts = np.asarray(noisy_counts, dtype=np.float64)
    share = np.floor(np.clip(counts, 0, 1e12) / rows_per_point)
    sizes = np.where(counts >= 1, np.clip(share, 1, per_class), 0).astype(np.int64)
    if sizes.sum() == 0:
        sizes[:] = 1
    return sizes


def synthetic_labels(noisy_counts: np.ndarray, per_class: int, rows_per_point: int) -> np.ndarray:
    """The label of each released point (points come sorted by class)."""
    sizes = points_per_class(noisy_counts, per_class, rows_per_point)
    return np.repeat(np.arange(sizes.size), sizes).astype(np.int64)


def initial_points(sizes: np.ndarray, ell: int, clip_norm: float) -> list[np.ndarray]:
    """Public starting points: one fixed generator, nothing of the data."""
    rng = np.random.default_rng(_INIT_SEED)
    return [
        rng.normal(size=(int(m), ell)) * (_INIT_SCALE * clip_norm / np.sqrt(ell)) for m in sizes
    ]


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    logits = logits - logits.max(axis=1, keepdims=True)
    np.exp(logits, out=logits)
    logits /= logits.sum(axis=1, keepdims=True)
    return logits


def record_gradient_sum(
    x: np.ndarray, y: np.ndarray, g: np.ndarray, reg: float, clip_norm: float
) -> np.ndarray:
    """Σ_i clip(u(x_i)) for one class: ``(m·ℓ + m,)``, each record's vector clipped to norm
    ``GRADIENT_CLIP`` (module docstring). Rows ``x`` must already satisfy ``‖x_i‖ ≤ C``."""
    m, ell = y.shape
    if x.shape[0] == 0:
        return np.zeros(m * ell + m)
    c = clip_norm
    # cost ‖x − y‖²/(2C²), without an n × m × ℓ temporary
    sq = (x * x).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2.0 * (x @ y.T)
    cost = np.maximum(sq, 0.0) / (2.0 * c * c)
    b = 1.0 / m
    w = _softmax_rows((g[None, :] - cost) / reg)
    # ‖u(x_i)‖² = Σ_j w_ij²·‖y_j − x_i‖²/C² + ‖w_i − b‖²
    norm2 = (w * w * (2.0 * cost)).sum(1) + ((w - b) ** 2).sum(1)
    scale = GRADIENT_CLIP / np.maximum(np.sqrt(norm2), GRADIENT_CLIP)
    a = w * scale[:, None]  # (n, m) clipped weights
    mass = a.sum(0)  # Σ_i s_i w_ij
    grad_y = (mass[:, None] * y - a.T @ x) / c
    grad_g = mass - b * scale.sum()
    return np.concatenate([grad_y.reshape(-1), grad_g])


def _debias_step(y: np.ndarray, reg: float, clip_norm: float) -> np.ndarray:
    """Gradient of −½·OT_λ(ν_Y, ν_Y) per point, scaled like the cross term (a point's move
    toward ``y_j − barycentre_j``) and clipped per point to norm C: no private data, no noise."""
    m = y.shape[0]
    if m < 2:
        return np.zeros_like(y)
    c = clip_norm
    sq = (y * y).sum(1)[:, None] + (y * y).sum(1)[None, :] - 2.0 * (y @ y.T)
    cost = np.maximum(sq, 0.0) / (2.0 * c * c)
    b = np.full(m, 1.0 / m)
    plan, _ = fast.sinkhorn(b, b, cost, reg, max_iter=200, stop_thr=1e-6, dtype=np.float64)
    bary = (plan @ y) * m
    step = y - bary  # descent on −OT(Y, Y) pushes each point away from its barycentre
    norms = np.linalg.norm(step, axis=1, keepdims=True)
    return np.asarray(step * np.minimum(1.0, c / np.maximum(norms, 1e-300)))


def _project_ball(y: np.ndarray, radius: float) -> np.ndarray:
    """Each point onto the ball of radius C; a non-finite point (unreachable within the terms'
    bounds) restarts at the origin rather than carrying NaN into later steps."""
    y = np.where(np.all(np.isfinite(y), axis=1, keepdims=True), y, 0.0)
    with np.errstate(over="ignore"):
        norms = np.linalg.norm(y, axis=1, keepdims=True)
    norms = np.where(np.isfinite(norms), norms, np.finfo(np.float64).max)
    return np.asarray(y * np.minimum(1.0, radius / np.maximum(norms, 1e-300)))


def train_synthetic(
    x: np.ndarray,
    labels: np.ndarray,
    noisy_counts: np.ndarray,
    params: SinkhornSyntheticParams,
    noise_multiplier: float,
    rng: np.random.Generator,
    *,
    noise: Callable[[tuple[int, ...], float, np.random.Generator], np.ndarray] | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> np.ndarray:
    """Train the synthetic points; returns them stacked by class, ``(Σ m_c, ℓ)``.

    ``x``: the clipped projected rows (``‖x_i‖ ≤ C``); ``noisy_counts``: the charged noisy
    histogram; ``noise_multiplier``: σ of each step (noise std ``2σ`` on every coordinate of the
    stacked clipped sums). ``noise`` replaces the sampler (tests pass a weakened one).
    """
    draw = gaussian_noise if noise is None else noise
    p = params
    ell = x.shape[1]
    sizes = points_per_class(noisy_counts, p.synthetic_points, p.rows_per_point)
    classes = [int(k) for k in np.flatnonzero(sizes)]
    rows = [x[labels == k] for k in classes]
    n_hat = [max(float(noisy_counts[k]), 1.0) for k in classes]
    ys = initial_points(sizes, ell, p.clip_norm)
    ys = [ys[k] for k in classes]
    gs = [np.zeros(int(sizes[k])) for k in classes]
    avg = [np.zeros_like(v) for v in ys]
    kept = 0
    std = noise_multiplier * REPLACE_ONE_SENSITIVITY
    c = p.clip_norm
    for t in range(p.steps):
        sums = [
            record_gradient_sum(r, v, g, p.reg, c) for r, v, g in zip(rows, ys, gs, strict=True)
        ]
        flat = np.concatenate(sums)
        noisy = flat + draw(flat.shape, std, rng)  # the only contact with private data
        at = 0
        for i, (v, g) in enumerate(zip(ys, gs, strict=True)):
            m = v.shape[0]
            part = noisy[at : at + m * ell + m]
            at += m * ell + m
            grad_y = part[: m * ell].reshape(m, ell) * (c / n_hat[i])  # ≈ E_x[w_j (y_j − x)]
            grad_g = part[m * ell :] / n_hat[i]  # ≈ E_x[w_j] − b_j
            move = m * grad_y  # natural scaling: η = 1 is a Lloyd step to the soft barycentre
            if p.debias > 0:
                move = move - p.debias * _debias_step(v, p.reg, c)
            ys[i] = _project_ball(v - p.learning_rate * move, c)
            # ascent on the semi-dual in g (a damped Sinkhorn update, in units of λ)
            gs[i] = np.clip(g - p.learning_rate * p.reg * m * grad_g, -50.0 * p.reg, 50.0 * p.reg)
        if t >= p.steps // 2:
            for i, v in enumerate(ys):
                avg[i] += v
            kept += 1
        if progress is not None:
            progress(t + 1, p.steps)
    out = np.zeros((int(sizes.sum()), ell))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    for i, k in enumerate(classes):
        out[starts[k] : starts[k + 1]] = avg[i] / max(kept, 1)
    return out
