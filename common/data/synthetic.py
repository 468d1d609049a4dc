"""A synthetic two-domain problem for the demo and the tests (no external data).

Classes are Gaussian clusters in ``k`` dimensions. The target domain is the source distribution
after a moderate rotation, a per-feature rescaling and a shift, with unequal class proportions:
a classifier trained on the source does poorly on the target, and transport recovers most of
the gap.
"""

from __future__ import annotations

import numpy as np

from dpda.data.loaders import Domain


def two_domains(
    n_source: int = 600,
    n_target: int = 500,
    k: int = 40,
    n_classes: int = 5,
    separation: float = 5.0,
    angle: float = 1.0,
    shift: float = 2.0,
    seed: int = 0,
) -> tuple[Domain, Domain]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, size=(n_classes, k))
    centres *= separation / np.linalg.norm(centres, axis=1, keepdims=True)

    def draw(n: int, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        y = rng.choice(n_classes, size=n, p=weights)
        return centres[y] + rng.normal(0.0, 1.0, size=(n, k)), y.astype(np.int64)

    xs, ys = draw(n_source, np.full(n_classes, 1.0 / n_classes))
    w = rng.uniform(0.5, 1.5, size=n_classes)
    xt, yt = draw(n_target, w / w.sum())
    # rotation by ``angle`` in k/2 random planes
    q, _ = np.linalg.qr(rng.normal(size=(k, k)))
    rot = np.eye(k)
    c, s = np.cos(angle), np.sin(angle)
    for i in range(0, k - 1, 2):
        u, v = q[:, i : i + 1], q[:, i + 1 : i + 2]
        rot = rot + (c - 1) * (u @ u.T + v @ v.T) + s * (v @ u.T - u @ v.T)
    scale = rng.uniform(0.7, 1.3, size=k)
    xt = (xt @ rot) * scale + shift * rng.normal(size=(1, k)) / np.sqrt(k) * 3
    return (
        Domain("synthetic-source", xs, ys, n_classes),
        Domain("synthetic-target", xt, yt, n_classes),
    )


def public_source_problem(
    n_source: int = 1000, n_target: int = 1000, d: int = 10, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The regression problem of the public-source paper's experiment: ``(xs, ys, xt, yt)``.

    Target P = N(μ_P, σ²I), source = 25% P + 75% Q with Q = N(μ_Q, σ²I), σ² = 1/(9d),
    μ_P = (−1/√(2d), 1/√(2d), −1/√(2d), …) (alternating), μ_Q = (1/√(2d), …, 1/√(2d)); labels
    f(x) = x·1̄ if 1̄·x > 0, else ½·x·1̄, with 1̄ = (1/√d, …). (The paper's text gives the
    centres as "(−1/√(2d), 1/√(2d), …)" and "(1/√(2d), …)"; the alternating and constant
    continuations are our reading.) ``yt`` is for evaluation and the oracle only.
    """
    rng = np.random.default_rng(seed)
    s = 1.0 / np.sqrt(2 * d)
    mu_p = np.where(np.arange(d) % 2 == 0, -s, s)
    mu_q = np.full(d, s)
    sd = np.sqrt(1.0 / (9 * d))
    ones = np.full(d, 1.0 / np.sqrt(d))

    def label(x: np.ndarray) -> np.ndarray:
        z = x @ ones
        return np.where(z > 0, z, 0.5 * z)

    from_p = rng.random(n_source) < 0.25
    xs = np.where(from_p[:, None], mu_p, mu_q) + rng.normal(size=(n_source, d)) * sd
    xt = mu_p + rng.normal(size=(n_target, d)) * sd
    return xs, label(xs), xt, label(xt)
