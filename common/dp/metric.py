"""A ground cost learned under DP: a Mahalanobis map ``W`` from the source's labels.

What is learned. A linear map ``W`` (``d′ × ℓ``, in the session's projected space) that brings
same-class rows together and pushes other-class rows at least a margin apart, by descent on the
contrastive loss of the paper over labeled pairs ``(i, j)``:

    L(W) = Σ_(i,j) y_ij·D_ij² + (1 − y_ij)·max(0, μ − D_ij)²,   D_ij = ‖W(u_i − u_j)‖,

with ``u_i = z_i / C`` the source's projected rows clipped to the session's norm ``C`` (so
``‖u_i‖ ≤ 1``; the loss is then well defined and the margin ``μ`` is a public number in units of
``C``, not the paper's mean distance of dissimilar pairs, which is data-dependent).

The pair graph comes from record *positions* only, after a secret uniform shuffle of the records
(drawn from the session's CSPRNG stream, never released): the source may store its rows in any
order (sorted by class, say), and replacing one record can then move every row after it; the
shuffle makes the release a function of the *set* of records (for two neighbouring sets, couple
the shuffles so that the replaced record lands on the same position: the two shuffled sequences
differ in that one position, and the bound below holds for each coupled pair, hence for the
mixture). Position ``i`` is paired with partners drawn by a public generator from ``(n, m,
seed)``: ``⌊m/2⌋`` random permutations ``π`` give the pairs
``(i, π(i))`` (each adds two pairs per record: ``i → π(i)`` and ``π⁻¹(i) → i``; fixed points are
dropped) and, for odd ``m``, one random perfect matching adds one. So every record joins at most
``m`` = ``pairs_per_record`` pairs, a public cap, and the graph is the same for every dataset of
``n`` records. Only the similarity ``y_ij = [label_i = label_j]`` reads the labels. (A pairing that
sorted or matched rows by class would move many pairs when one label changed.)

Sensitivity, on the whole map. Each pair's gradient ``∇_W ℓ_ij`` is a rank-one matrix
``c_ij·W Δ Δᵀ`` (``Δ = u_i − u_j``; ``c = 2`` for a similar pair, ``−2(μ − D)/D`` for a
dissimilar pair inside the margin, 0 otherwise), clipped to Frobenius norm ``G`` (public). Replace
one record (its features *and* its label): exactly the ≤ ``m`` pair terms that contain it change,
each by at most ``2G``; every other term is unchanged (the graph is indexed, not data-driven).
So the clipped gradient *sum* moves by at most ``2mG`` in Frobenius norm whatever the rows, the
labels or the current ``W`` — the DP argument rests on this clip alone (the row clip only makes
the loss well defined). Each step adds ``N(0, (σ·2mG)²)`` to every coordinate of the sum
(``gaussian_noise``, the session's CSPRNG stream).

What is charged. ``T`` full-batch steps, each a Gaussian mechanism of multiplier σ on a query
chosen from public values and earlier noisy outputs: ``SelfComposedDpEvent(Gaussian(σ), T)``,
exactly one Gaussian of multiplier ``σ/√T`` (the same reading as ``sinkhorn_synthetic``). The
sensitivity ``2mG`` is the replace-one one; the policy's only relation for whole records is
replace-one, and attribute neighbours (one feature of one record) are replace-one neighbours
too, so the charge holds under every relation a session can have. Why no subsampling: the ledger
composes record-level events under add/remove with the replace-one factor folded into the
sensitivity, which is exact for unsampled Gaussians but not for a Poisson-sampled one (see
``sinkhorn_synthetic``); the paper's minibatches appear only in ``dpda bench metric``'s
reproduction of its toy, at the pair level, as the paper does.

Everything after the noisy sums (the step, the average of the iterates of the second half, which
is released) is post-processing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from dpda.dp.mechanisms import gaussian_noise

# the public pair graph: one fixed generator keyed by (this, n, m), nothing of the data
PAIR_GRAPH_SEED = 30017


@dataclass(frozen=True)
class MetricParams:
    """The public knobs of one metric release (all from the session terms)."""

    dim: int  # d′: rows of W
    pairs_per_record: int  # m: the cap on the pairs one record joins
    margin: float  # μ, in units of the clip norm C
    metric_clip: float  # G: per-pair gradient clip (Frobenius), the term of the same name
    steps: int  # T full-batch noisy steps
    learning_rate: float  # η


def replace_one_sensitivity(pairs_per_record: int, metric_clip: float) -> float:
    """Frobenius sensitivity of the clipped gradient sum when one record is replaced: ``2mG``."""
    return 2.0 * pairs_per_record * metric_clip


def pair_graph(n: int, pairs_per_record: int, seed: int = PAIR_GRAPH_SEED) -> np.ndarray:
    """``(P, 2)`` record-index pairs, each record in at most ``pairs_per_record`` of them.

    Depends on ``n``, ``pairs_per_record`` and the public seed only (module docstring)."""
    rng = np.random.default_rng([seed, n, pairs_per_record])
    idx = np.arange(n)
    parts = []
    for _ in range(pairs_per_record // 2):
        perm = rng.permutation(n)
        keep = perm != idx
        parts.append(np.stack([idx[keep], perm[keep]], axis=1))
    if pairs_per_record % 2 == 1 and n >= 2:
        perm = rng.permutation(n)
        half = n // 2
        parts.append(np.stack([perm[:half], perm[half : 2 * half]], axis=1))
    if not parts:
        return np.zeros((0, 2), dtype=np.int64)
    return np.concatenate(parts).astype(np.int64)


def secret_order(n: int, rng: np.random.Generator) -> np.ndarray:
    """The records' positions in the pair graph: a uniform permutation from the session's
    stream (module docstring). The ε audit replaces it by the identity to reach the worst case
    on every draw (the shuffle can only lower the privacy loss: a mixture)."""
    return np.asarray(rng.permutation(n))


def initial_metric(dim: int, ell: int) -> np.ndarray:
    """Public start: the first ``d′`` coordinates of the projected space (with the target's PCA
    basis, its leading principal directions)."""
    return np.eye(dim, ell)


def clipped_gradient_sum(
    w: np.ndarray,
    u: np.ndarray,
    pairs: np.ndarray,
    similar: np.ndarray,
    margin: float,
    metric_clip: float,
) -> np.ndarray:
    """``Σ_p clip_G(∇_W ℓ_p)`` (``d′ × ℓ``) without forming the ``P × d′ × ℓ`` stack: each
    gradient is ``c_p·(W Δ_p) Δ_pᵀ``, of Frobenius norm ``|c_p|·‖WΔ_p‖·‖Δ_p‖`` (rank one), so its
    clipped version is ``s_p·(W Δ_p) Δ_pᵀ`` with a scalar ``s_p`` and the sum is
    ``(WΔ)ᵀ diag(s) Δ``."""
    if pairs.shape[0] == 0:
        return np.zeros_like(w)
    delta = u[pairs[:, 0]] - u[pairs[:, 1]]
    wd = delta @ w.T
    dist = np.sqrt(np.einsum("ij,ij->i", wd, wd))
    dn = np.sqrt(np.einsum("ij,ij->i", delta, delta))
    inside = (~similar) & (dist < margin)
    coef = np.where(similar, 2.0, 0.0)
    coef = np.where(inside, -2.0 * (margin - dist) / np.maximum(dist, 1e-12), coef)
    norm = np.abs(coef) * dist * dn
    s = coef * np.minimum(1.0, metric_clip / np.maximum(norm, 1e-300))
    # Σ s_p (WΔ_p) Δ_pᵀ from the very WΔ whose norm was clipped (not W·(Δᵀ diag(s) Δ), where the
    # rounding of a huge s_p on a WΔ_p of ~0 is multiplied by W and escapes the clip)
    return np.asarray((wd * s[:, None]).T @ delta)


def contrastive_loss(
    w: np.ndarray, u: np.ndarray, pairs: np.ndarray, similar: np.ndarray, margin: float
) -> float:
    """Mean contrastive loss over the pairs (diagnostics and benchmarks; never released)."""
    if pairs.shape[0] == 0:
        return 0.0
    wd = (u[pairs[:, 0]] - u[pairs[:, 1]]) @ w.T
    dist = np.sqrt(np.einsum("ij,ij->i", wd, wd))
    loss = np.where(similar, dist**2, np.maximum(0.0, margin - dist) ** 2)
    return float(loss.mean())


Noise = Callable[[tuple[int, ...], float, np.random.Generator], np.ndarray]


def train_metric(
    z: np.ndarray,
    labels: np.ndarray,
    params: MetricParams,
    clip_norm: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    *,
    noise: Noise | None = None,
    trace: list[float] | None = None,
) -> np.ndarray:
    """Learn ``W`` (``d′ × ℓ``) from clipped projected rows ``z`` (``‖z_i‖ ≤ C``) and labels.

    ``noise_multiplier``: σ of each step (noise std ``σ·2mG`` on every coordinate of the clipped
    gradient sum; 0 only for the benchmarks' non-private reference). ``noise`` replaces the
    sampler (tests pass a weakened one); ``trace`` collects the loss after each step.
    """
    draw = gaussian_noise if noise is None else noise
    p = params
    n, ell = z.shape
    order = secret_order(n, rng)  # the secret shuffle (module docstring); nothing of it leaves
    u, labels = z[order] / clip_norm, np.asarray(labels)[order]
    pairs = pair_graph(n, p.pairs_per_record)
    similar = labels[pairs[:, 0]] == labels[pairs[:, 1]]
    n_pairs = max(int(pairs.shape[0]), 1)  # public: the graph depends on n and m only
    std = noise_multiplier * replace_one_sensitivity(p.pairs_per_record, p.metric_clip)
    w = initial_metric(p.dim, ell)
    avg = np.zeros_like(w)
    kept = 0
    for t in range(p.steps):
        g = clipped_gradient_sum(w, u, pairs, similar, p.margin, p.metric_clip)
        if std > 0:
            g = g + draw(g.shape, std, rng)  # the only contact with private data
        w = w - p.learning_rate * g / n_pairs
        if trace is not None:
            trace.append(contrastive_loss(w, u, pairs, similar, p.margin))
        if t >= p.steps // 2:
            avg += w
            kept += 1
    return np.asarray(avg / max(kept, 1))


def metric_work(n_rows: int, ell: int, dim: int, pairs_per_record: int, steps: int) -> float:
    """Upper bound on one metric release's work, in multiply-adds: per step every pair forms
    ``Δ`` and ``WΔ`` and adds ``Δ Δᵀ`` (``ℓ² + d′ℓ``), and one ``d′ × ℓ × ℓ`` product."""
    pairs = n_rows * pairs_per_record
    return float(steps * (pairs * (ell * ell + dim * ell + 2 * ell) + dim * ell * ell))


def metric_memory(n_rows: int, ell: int, dim: int, pairs_per_record: int) -> float:
    """Peak bytes of one step's temporaries, an upper bound: the pair indices (2 int64 a pair),
    ``Δ`` and its scaled copy (ℓ each) and ``WΔ`` (d′), float64, plus a few per-pair scalars."""
    pairs = n_rows * pairs_per_record
    return float(8 * pairs * (2 + 2 * ell + dim + 6))
