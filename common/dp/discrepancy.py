"""Private discrepancy minimisation (seed 001): a public labeled source, a private unlabeled target.

Setting. The source sample ``x_1 … x_m`` (with labels) is public; the target's rows ``t_1 … t_n``
are private and stay with their holder. For linear hypotheses ``‖w‖ ≤ Λ`` and the squared loss,
the discrepancy between the q-weighted source and the target is ``4Λ²·‖M(q)‖₂`` with

    M(q) = Σ_i q_i x_i x_iᵀ − (1/n) Σ_j t_j t_jᵀ        (a symmetric d × d matrix),

and ``‖·‖₂`` the spectral norm. The data holder clips its rows to ``‖t_j‖ ≤ r`` (public), so
replacing one row moves the second term by ``(t tᵀ − t′t′ᵀ)/n``, of spectral norm ≤ r²/n.

Smooth approximation. ``F̃(q) = (1/μ)·log Σ_k (e^{μλ_k} + e^{−μλ_k})`` over the eigenvalues λ_k
of M(q): ``‖M‖₂ ≤ F̃ ≤ ‖M‖₂ + log(2d)/μ``. Its gradient in M is
``G = U·diag((e^{μλ} − e^{−μλ})/Z)·Uᵀ`` (nuclear norm 1), and in q, ``∂F̃/∂q_i = x_iᵀ G x_i``.

Sensitivity (the derivation the README restates). F̃ is the log-sum-exp of the eigenvalues of
the block matrix diag(M, −M), a spectral function that is μ-smooth with respect to the spectral
norm (Nesterov 2007): ``‖G(M) − G(M′)‖_* ≤ μ·‖M − M′‖₂`` in the nuclear norm. Hence, for one
replaced target row,

    |∂F̃/∂q_i(T) − ∂F̃/∂q_i(T′)| = |x_iᵀ (G − G′) x_i| ≤ ‖x_i‖²·‖G − G′‖₂ ≤ R²·μ·r²/n

for every i (``R`` bounds the public source rows). So the gradient moves by at most
``Δ∞ = μR²r²/n`` in every coordinate (ℓ∞), and by at most ``√m·Δ∞`` in ℓ2.

Mechanisms.

* **Noisy Frank–Wolfe** (over the simplex): each step picks the vertex ``argmin_i ∇_i`` with the
  exponential mechanism (Gumbel-max, utility −∇_i of sensitivity Δ∞, ``P(i) ∝ exp(−ε₀∇_i/(2Δ∞))``):
  ε₀-DP, and ε₀²/8-zCDP because it has bounded range ε₀ (Cesar & Rogers 2021). T steps are
  ``SelfComposed(ExponentialMechanismDpEvent(ε₀), T)``, accounted with the project's RDP
  accountant (bounded range) here and as generic ε₀-DP by the ledger's PLD accountant; the
  pure composition Tε₀ bounds both (tested).
* **Noisy mirror descent**: ``q ← q ∘ exp(−η(∇ + N(0, (σ√m·Δ∞)²)))``, normalised; T Gaussian
  steps of multiplier σ, exactly one Gaussian of σ/√T.

Everything after the noisy outputs (the Frank–Wolfe averaging, the normalisation, the second
stage's weighted ridge regression on the public source) is post-processing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from dp_accounting import dp_event

from dpda.dp.accounting import epsilon_of
from dpda.dp.events import ExponentialMechanismDpEvent
from dpda.dp.mechanisms import gaussian_noise

SMOOTHING = 20.0  # μ: F̃ ≤ ‖M‖₂ + log(2d)/μ (≈ +0.15 at d = 10)
RIDGE = 1e-3  # λ on ‖q‖² in the first stage and on ‖w‖² in the second


def clip_rows_to(x: np.ndarray, r: float) -> np.ndarray:
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.asarray(x * np.minimum(1.0, r / np.maximum(norms, 1e-300)))


def second_moment(t: np.ndarray) -> np.ndarray:
    """(1/n) Σ t tᵀ: the only statistic of the private rows the objective reads."""
    return np.asarray(t.T @ t / t.shape[0])


def m_matrix(q: np.ndarray, x: np.ndarray, target_moment: np.ndarray) -> np.ndarray:
    return np.asarray((x * q[:, None]).T @ x - target_moment)


def discrepancy(q: np.ndarray, x: np.ndarray, target_moment: np.ndarray) -> float:
    """‖M(q)‖₂, the discrepancy up to the factor 4Λ²."""
    return float(np.max(np.abs(np.linalg.eigvalsh(m_matrix(q, x, target_moment)))))


def smooth_discrepancy_grad(
    q: np.ndarray, x: np.ndarray, target_moment: np.ndarray, mu: float
) -> tuple[float, np.ndarray]:
    """(F̃(q), ∇_q F̃(q)) for the smooth approximation (module docstring)."""
    lam, u = np.linalg.eigh(m_matrix(q, x, target_moment))
    top = float(np.max(np.abs(lam)))
    ep, em = np.exp(mu * (lam - top)), np.exp(mu * (-lam - top))
    z = float(ep.sum() + em.sum())
    value = top + math.log(z) / mu
    g = (u * ((ep - em) / z)) @ u.T
    grad = np.einsum("ij,jk,ik->i", x, g, x)
    return value, grad


def gradient_sensitivity(mu: float, source_radius: float, target_radius: float, n: int) -> float:
    """Δ∞ = μ·R²·r²/n: the most one replaced target row moves any coordinate of ∇_q F̃."""
    return mu * source_radius**2 * target_radius**2 / n


def frank_wolfe_event(epsilon_step: float, steps: int) -> dp_event.DpEvent:
    """T exponential-mechanism steps of ε₀ (each ε₀-DP with bounded range: ε₀²/8-zCDP)."""
    return dp_event.SelfComposedDpEvent(ExponentialMechanismDpEvent(epsilon_step), steps)


def mirror_descent_event(sigma: float, steps: int) -> dp_event.DpEvent:
    return dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(sigma), steps)


def epsilon_of_event(event: dp_event.DpEvent, delta: float) -> float:
    """ε at δ under the project's RDP accountant (which takes the bounded-range zCDP of the
    exponential mechanism; its PLD accountant, the ledger's, bounds it as generic ε₀-DP)."""
    return epsilon_of([event], delta, "rdp")


def exponential_select(
    loss: np.ndarray, epsilon: float, sensitivity: float, rng: np.random.Generator
) -> int:
    """The index of the smallest ``loss`` by the exponential mechanism: ``P(i) ∝
    exp(−ε·loss_i/(2Δ))``, sampled exactly with the Gumbel-max trick; ε-DP when every loss moves
    by at most Δ (``ExponentialMechanismDpEvent``)."""
    scores = -epsilon * np.asarray(loss, dtype=np.float64) / (2.0 * sensitivity)
    return int(np.argmax(scores + rng.gumbel(size=scores.shape)))


def frank_wolfe_step_epsilon(epsilon: float, delta: float, steps: int) -> float:
    """The largest ε₀ whose T steps spend at most ε at δ (bisection, rounded down)."""
    lo, hi = 0.0, epsilon
    for _ in range(60):
        mid = (lo + hi) / 2
        if epsilon_of_event(frank_wolfe_event(mid, steps), delta) <= epsilon:
            lo = mid
        else:
            hi = mid
    return lo


def mirror_descent_sigma(epsilon: float, delta: float, steps: int) -> float:
    """The smallest σ per step whose T steps spend at most ε at δ (bisection, rounded up)."""
    lo, hi = 1e-3, 1e4
    for _ in range(80):
        mid = math.sqrt(lo * hi)
        if epsilon_of_event(mirror_descent_event(mid, steps), delta) <= epsilon:
            hi = mid
        else:
            lo = mid
    return hi


@dataclass(frozen=True)
class PrivateWeights:
    q: np.ndarray
    epsilon: float  # what the events spend at δ (RDP accountant)
    event: dp_event.DpEvent


def noisy_frank_wolfe(
    x: np.ndarray,
    target_moment: np.ndarray,
    *,
    epsilon: float | None,
    delta: float,
    steps: int,
    mu: float,
    ridge: float,
    sensitivity: float,
    rng: np.random.Generator,
    extra_grad: np.ndarray | None = None,
) -> PrivateWeights:
    """Private Frank–Wolfe on F̃(q) + ridge·‖q‖² over the simplex (module docstring).
    ``epsilon=None``: the same iterations without privacy (exact argmin; for comparison only,
    charged as not private)."""
    m = x.shape[0]
    eps0 = None if epsilon is None else frank_wolfe_step_epsilon(epsilon, delta, steps)
    q = np.full(m, 1.0 / m)
    for t in range(steps):
        _, g = smooth_discrepancy_grad(q, x, target_moment, mu)
        g = g + 2 * ridge * q + (0.0 if extra_grad is None else extra_grad)
        if eps0 is None:
            vertex = int(np.argmin(g))
        else:
            vertex = exponential_select(g, eps0, sensitivity, rng)
        step = 2.0 / (t + 2)
        q = (1 - step) * q
        q[vertex] += step
    if eps0 is None:
        return PrivateWeights(q, math.inf, dp_event.NonPrivateDpEvent())
    event = frank_wolfe_event(eps0, steps)
    return PrivateWeights(q, epsilon_of_event(event, delta), event)


def noisy_mirror_descent(
    x: np.ndarray,
    target_moment: np.ndarray,
    *,
    epsilon: float,
    delta: float,
    steps: int,
    mu: float,
    ridge: float,
    sensitivity: float,
    rng: np.random.Generator,
    learning_rate: float,
) -> PrivateWeights:
    """Private mirror descent (exponentiated gradient) on the simplex, Gaussian noise at ℓ2
    sensitivity √m·Δ∞; the average iterate is returned."""
    m = x.shape[0]
    sigma = mirror_descent_sigma(epsilon, delta, steps)
    l2 = math.sqrt(m) * sensitivity
    logq = np.full(m, -math.log(m))
    avg = np.zeros(m)
    for _ in range(steps):
        q = np.exp(logq - logq.max())
        q /= q.sum()
        avg += q
        _, g = smooth_discrepancy_grad(q, x, target_moment, mu)
        noisy = g + gaussian_noise((m,), sigma * l2, rng) + 2 * ridge * q
        logq = logq - learning_rate * noisy
    event = mirror_descent_event(sigma, steps)
    return PrivateWeights(avg / steps, epsilon_of_event(event, delta), event)


def weighted_ridge(x: np.ndarray, y: np.ndarray, q: np.ndarray, lam: float) -> np.ndarray:
    """argmin_w Σ q_i (w·x_i − y_i)² + lam·‖w‖² (the public second stage)."""
    a = (x * q[:, None]).T @ x + lam * np.eye(x.shape[1])
    return np.asarray(np.linalg.solve(a, (x * q[:, None]).T @ y))
