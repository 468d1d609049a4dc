"""Private discrepancy minimisation: a public labeled source, a private unlabeled target.

Setting. The source sample ``x_1 … x_m`` (with labels) is public; the target's rows ``t_1 … t_n``
are private and stay with their holder. For linear hypotheses ``‖w‖ ≤ Λ`` and the squared loss,
the discrepancy between the q-weighted source and the target is ``4Λ²·‖M(q)‖₂`` with

    M(q) = Σ_i q_i x_i x_iᵀ − (1/n) Σ_j t_j t_jᵀ        (a symmetric d × d matrix),

and ``‖·‖₂`` the spectral norm. The data holder clips its rows to ``‖t_j‖ ≤ r`` (public), so
replacing one row moves the second term by ``(t tᵀ − t′t′ᵀ)/n``, of spectral norm ≤ r²/n.

Smooth approximation. ``F̃(q) = (1/μ)·log Σ_k (e^{μλ_k} + e^{−μλ_k})`` over the eigenvalues λ_k
of M(q): ``‖M‖₂ ≤ F̃ ≤ ‖M‖₂ + log(2d)/μ``. Its gradient in M is
``G = U·diag((e^{μλ} − e^{−μλ})/Z)·Uᵀ`` (nuclear norm ≤ 1), and in q, ``∂F̃/∂q_i = x_iᵀ G x_i``.

Sensitivity (the derivation the README restates). F̃ is the log-sum-exp of the eigenvalues of
the block matrix diag(M, −M), a spectral function that is μ-smooth with respect to the spectral
norm (Nesterov 2007): ``‖G(M) − G(M′)‖_* ≤ μ·‖M − M′‖₂`` in the nuclear norm. Hence, for one
replaced target row,

    |∂F̃/∂q_i(T) − ∂F̃/∂q_i(T′)| = |x_iᵀ (G − G′) x_i| ≤ ‖x_i‖²·‖G − G′‖₂ ≤ R²·μ·r²/n

for every i (``R`` bounds the public source rows). So the gradient moves by at most
``μR²r²/n`` in every coordinate; and since G has nuclear norm ≤ 1, ``|x_iᵀ G x_i| ≤ R²`` on
either side, so by at most ``2R²`` too: ``Δ∞ = R²·min(μr²/n, 2)`` in ℓ∞, ``√m·Δ∞`` in ℓ2.

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
from collections.abc import Callable
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
    """Δ∞ = R²·min(μr²/n, 2): the most one replaced target row moves any coordinate of ∇_q F̃.
    The first term is the smoothness bound (module docstring); the second holds whatever the
    data, because G has nuclear norm ≤ 1, so ``|x_iᵀ G x_i| ≤ R²`` on either side (it binds
    only for n < μr²/2: 10 rows at the default μ = 20, r = 1)."""
    return source_radius**2 * min(mu * target_radius**2 / n, 2.0)


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


METHODS = ("noisy-fw", "noisy-md", "single-stage")
PREDICTOR_RADIUS = 2.0  # Λ, the single-stage predictor's ball
MD_LEARNING_RATE = 0.5


class Reweighter:
    """The optimiser's state and every public step of it; the one place both parties of the
    public-source deployment (and the in-process runs) advance it.

    The data holder calls ``private_gradient`` (the only read of its rows, through their second
    moment) and turns it into a DP output: a vertex (``select``) or a noisy gradient
    (``noisy_gradient``). Both parties then ``advance`` with that output: the update is a
    function of public data (the source rows, their labels for ``single-stage``) and of the DP
    outputs alone, so the driver replays exactly the holder's state.

    ``single-stage`` (the public-source paper's Algorithm 2): a Frank–Wolfe step on q for
    ``Σ q_i (w·x_i − y_i)² + 4Λ²·F̃(q)`` (only the F̃ part reads private data: its sensitivity is
    ``4Λ²·Δ∞``), then a public Frank–Wolfe step on w over the ball ``‖w‖ ≤ Λ``.
    """

    def __init__(
        self,
        x: np.ndarray,
        method: str,
        *,
        mu: float = SMOOTHING,
        ridge: float = RIDGE,
        y: np.ndarray | None = None,
        learning_rate: float = MD_LEARNING_RATE,
        predictor_radius: float = PREDICTOR_RADIUS,
    ) -> None:
        if method not in METHODS:
            raise ValueError(f"method: one of {METHODS}")
        if method == "single-stage" and y is None:
            raise ValueError("single-stage needs the source's labels")
        self.x, self.y, self.method = x, y, method
        self.mu, self.ridge, self.lr = mu, ridge, learning_rate
        self.radius = predictor_radius
        m = x.shape[0]
        self.t = 0
        self.q = np.full(m, 1.0 / m)
        self.w = np.zeros(x.shape[1])
        self._logq = np.full(m, -math.log(m))
        self._avg = np.zeros(m)

    @staticmethod
    def scale_of(method: str, predictor_radius: float) -> float:
        """The factor on F̃ in the objective: the private gradient's sensitivity is this × Δ∞."""
        return 4 * predictor_radius**2 if method == "single-stage" else 1.0

    @property
    def private_scale(self) -> float:
        return self.scale_of(self.method, self.radius)

    def private_gradient(self, target_moment: np.ndarray) -> np.ndarray:
        """∇_q of the private part (``private_scale``·F̃) at the current iterate."""
        _, g = smooth_discrepancy_grad(self.q, self.x, target_moment, self.mu)
        return self.private_scale * g

    def public_gradient(self) -> np.ndarray:
        if self.method == "single-stage":
            assert self.y is not None
            return np.asarray((self.x @ self.w - self.y) ** 2)
        return 2 * self.ridge * self.q

    def select(
        self,
        target_moment: np.ndarray,
        epsilon_step: float,
        sensitivity: float,
        rng: np.random.Generator,
    ) -> int:
        """The holder's DP output of a Frank–Wolfe step (``sensitivity`` = Δ∞)."""
        g = self.private_gradient(target_moment) + self.public_gradient()
        return exponential_select(g, epsilon_step, self.private_scale * sensitivity, rng)

    def exact_vertex(self, target_moment: np.ndarray) -> int:
        """The same step without privacy (for comparison only)."""
        return int(np.argmin(self.private_gradient(target_moment) + self.public_gradient()))

    def noisy_gradient(
        self, target_moment: np.ndarray, sigma: float, sensitivity: float, rng: np.random.Generator
    ) -> np.ndarray:
        """The holder's DP output of a mirror-descent step: the gradient plus Gaussian noise at
        its ℓ2 sensitivity √m·Δ∞ times ``sigma``."""
        g = self.private_gradient(target_moment)
        l2 = math.sqrt(g.size) * self.private_scale * sensitivity
        return np.asarray(g + gaussian_noise(g.shape, sigma * l2, rng))

    def advance(self, output: int | np.ndarray) -> None:
        """One step with the holder's DP output (a vertex, or a noisy gradient for noisy-md)."""
        if self.method == "noisy-md":
            self._avg += self.q
            noisy = np.asarray(output, dtype=np.float64) + self.public_gradient()
            self._logq = self._logq - self.lr * noisy
            q = np.exp(self._logq - self._logq.max())
            self.q = q / q.sum()
        else:
            vertex = int(output)
            step = 2.0 / (self.t + 2)
            if self.method == "single-stage":
                assert self.y is not None
                resid = self.x @ self.w - self.y
            self.q = (1 - step) * self.q
            self.q[vertex] += step
            if self.method == "single-stage":
                grad_w = 2 * (self.x * (self.q * resid)[:, None]).sum(0)
                norm = float(np.linalg.norm(grad_w))
                target = -self.radius * grad_w / norm if norm > 0 else self.w
                self.w = (1 - step) * self.w + step * target
        self.t += 1

    def weights(self) -> np.ndarray:
        """The result: the last iterate (Frank–Wolfe) or the average iterate (mirror descent)."""
        if self.method == "noisy-md":
            return self._avg / max(self.t, 1)
        return self.q


def step_event(method: str, step_parameter: float, steps: int) -> dp_event.DpEvent:
    """``steps`` steps of a method: ε₀ for the Frank–Wolfe methods, σ for mirror descent."""
    if method == "noisy-md":
        return mirror_descent_event(step_parameter, steps)
    return frank_wolfe_event(step_parameter, steps)


def step_parameter(method: str, epsilon: float, delta: float, steps: int) -> float:
    """ε₀ (Frank–Wolfe methods) or σ (mirror descent) whose ``steps`` steps spend ε at δ."""
    if method == "noisy-md":
        return mirror_descent_sigma(epsilon, delta, steps)
    return frank_wolfe_step_epsilon(epsilon, delta, steps)


def run_private(
    opt: Reweighter,
    target_moment: np.ndarray,
    *,
    epsilon: float | None,
    delta: float,
    steps: int,
    sensitivity: float,
    rng: np.random.Generator,
) -> PrivateWeights:
    """The whole optimisation in one process (simulation, benchmark); ``epsilon=None``: exact
    Frank–Wolfe steps, for comparison only (not private)."""
    if epsilon is None:
        for _ in range(steps):
            opt.advance(opt.exact_vertex(target_moment))
        return PrivateWeights(opt.weights(), math.inf, dp_event.NonPrivateDpEvent())
    p = step_parameter(opt.method, epsilon, delta, steps)
    for _ in range(steps):
        if opt.method == "noisy-md":
            opt.advance(opt.noisy_gradient(target_moment, p, sensitivity, rng))
        else:
            opt.advance(opt.select(target_moment, p, sensitivity, rng))
    event = step_event(opt.method, p, steps)
    return PrivateWeights(opt.weights(), epsilon_of_event(event, delta), event)


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
) -> PrivateWeights:
    """Private Frank–Wolfe on F̃(q) + ridge·‖q‖² over the simplex (module docstring)."""
    opt = Reweighter(x, "noisy-fw", mu=mu, ridge=ridge)
    return run_private(
        opt,
        target_moment,
        epsilon=epsilon,
        delta=delta,
        steps=steps,
        sensitivity=sensitivity,
        rng=rng,
    )


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
    learning_rate: float = MD_LEARNING_RATE,
) -> PrivateWeights:
    """Private mirror descent (exponentiated gradient) on the simplex, Gaussian noise at ℓ2
    sensitivity √m·Δ∞; the average iterate is returned."""
    opt = Reweighter(x, "noisy-md", mu=mu, ridge=ridge, learning_rate=learning_rate)
    return run_private(
        opt,
        target_moment,
        epsilon=epsilon,
        delta=delta,
        steps=steps,
        sensitivity=sensitivity,
        rng=rng,
    )


def holder_rows(
    x: np.ndarray, transform: Callable[[np.ndarray], np.ndarray], radius: float = 1.0
) -> np.ndarray:
    """The data holder's rows as the objective reads them: through the (peer-chosen, public)
    ``transform``, then clipped to ``radius``; a row the transform sends to a non-finite value
    becomes 0. Per row and bounded whatever the transform, so Δ∞ (``gradient_sensitivity``)
    holds for any map a peer asks for (the sensitivity of the whole map: docs/privacy-model.md,
    "The data holder's policy")."""
    with np.errstate(all="ignore"):
        t = np.asarray(transform(x), dtype=np.float64)
        t = np.where(np.all(np.isfinite(t), axis=1, keepdims=True), t, 0.0)
        return clip_rows_to(t, radius)


def weighted_ridge(x: np.ndarray, y: np.ndarray, q: np.ndarray, lam: float) -> np.ndarray:
    """argmin_w Σ q_i (w·x_i − y_i)² + lam·‖w‖² (the public second stage)."""
    a = (x * q[:, None]).T @ x + lam * np.eye(x.shape[1])
    return np.asarray(np.linalg.solve(a, (x * q[:, None]).T @ y))
