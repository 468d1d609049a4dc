"""The target's own disclosures under DP: its column scaling and its projection basis.

In the forward deployment the target sends the source two statistics of its whole dataset: its
column means and scales (``Scaling``) and its top-ℓ principal directions (the target-pca basis);
it also picks the record unit's clipping norm from its projected rows. Exact, each of them is a
function of every target row. This module releases them under the target's own (ε, δ), for the
replace-one relation on the target's rows (the row count n is public under it, as for the
source).

The whole map, in the target's per-row representation (``per_row``, a per-row function):

1. ``r_i = clip(per_row(x_i), C)``: each row clipped to L2 norm C (public: ``row_clip``);
2. column sums ``S = Σ r_i`` + N(0, (σ_s·2C)²) per column: replacing one row moves S by at most
   2C in L2 (two vectors of norm ≤ C);
3. column sums of squares ``Q = Σ r_i∘r_i`` + N(0, (σ_q·√2·C²)²): a row's squares form a
   non-negative vector of norm ≤ Σ_j r_j² ≤ C², and two non-negative vectors a, b of norm ≤ C²
   are at most √(‖a‖² + ‖b‖²) ≤ √2·C² apart;
4. mean = S/n, std = √max(Q/n − mean², 0), floored and shaped exactly as ``Scaling.of`` does
   (``zscore`` or ``uniform``) — post-processing of S and Q;
5. ``z_i = clip((r_i − mean)/std, C_z)`` with ``C_z = Z_CLIP·√k`` (public: k features; an
   average z-scored row has norm √k), a map built from released values only;
6. "Analyze Gauss" (Dwork, Talwar, Thakurta & Zhang 2014): ``A = Σ z_i z_iᵀ + E``, E symmetric
   with its upper triangle (diagonal included) i.i.d. N(0, (σ_c·√2·C_z²)²): one replaced row
   moves A by ``z zᵀ − z′z′ᵀ``, of Frobenius norm ≤ √2·C_z² by the argument of step 3 (the
   Frobenius norm of z zᵀ is ‖z‖²), and the upper triangle of a symmetric matrix has at most
   its Frobenius norm;
7. the basis: the top-ℓ eigenvectors of A; the clipping norm for the source's record unit:
   ``√(Σ_{i≤ℓ} max(λ_i, 0)/n)``, the root-mean-square norm of the projected rows as A says, and
   the variance along each direction, ``max(λ_i, 0)/n`` (kept by the target, for synthetic PATE
   queries) — post-processing.

PATE queries under the target's policy (``[privacy] row_queries``), after the disclosure:

- ``"dp"``: m target rows, a random subset drawn from the job's seed (an index draw that never
  looks at the data; the same subset for every session of the job), each projected row (the
  session's basis and scaling: released values) clipped to the session's clip norm C (itself
  released under DP above; a public value of the terms otherwise) and sent with N(0, (σ_r·2C)²)
  per coordinate. Replacing one target row moves at most one query, the replaced row's if it
  was drawn, by at most 2C: one Gaussian mechanism of multiplier σ_r on the concatenated
  queries, whatever m (``RowQueryPlan``), composed in the target's ledger with the disclosure
  it is conditioned on (adaptive composition).
- ``"synthetic"``: m points drawn from N(0, diag(v)) in the projected coordinates, v the DP
  variances of step 7 (or, with no DP basis, the public ‖column‖² of the projection): a function
  of released or public values only, no further charge.

The three Gaussians are charged as ``Gaussian(σ_s), Gaussian(σ_q), Gaussian(σ_c)``; composed they
are exactly one Gaussian of multiplier ``(Σ σ⁻²)^(-1/2)`` (the ledger merges them). The shares
``w`` give ``σ_i = σ/√w_i`` with σ the analytic Gaussian multiplier for (ε, δ), so that the three
compose to exactly σ.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
from dp_accounting import dp_event

from dpda.data.preprocessing import Scaling, per_row
from dpda.dp.calibration import calibrate_sigma
from dpda.dp.mechanisms import MIN_GAUSSIAN_STD, gaussian_noise

# ε shares (column sums, sums of squares, covariance), chosen from measurements (README)
DEFAULT_SHARES = (0.15, 0.15, 0.7)
# C_z = Z_CLIP·√k (the noise grows with C_z²; rows past it are clipped); chosen on
# Office-Caltech and the digits (docs/results.md, "Where the constants come from")
Z_CLIP = 0.5
# the representation's natural row bound, used as C when none is configured
NATURAL_CLIP = {"sqrt": 1.0, "l2": 1.0, "rownorm": 1.0}


@dataclass(frozen=True)
class DisclosurePlan:
    """Public: everything the noise and the charge depend on."""

    epsilon: float
    delta: float
    row_clip: float  # C, in the per-row representation
    z_clip: float  # C_z = √k
    sigmas: tuple[float, float, float]  # noise multipliers (sums, squares, covariance)

    @property
    def with_basis(self) -> bool:
        return math.isfinite(self.sigmas[2])

    def events(self) -> list[dp_event.DpEvent]:
        return [dp_event.GaussianDpEvent(s) for s in self.sigmas if math.isfinite(s)]

    def noise_stds(self) -> tuple[float, float, float]:
        s, q, c = self.sigmas
        return (
            s * 2 * self.row_clip,
            q * math.sqrt(2) * self.row_clip**2,
            c * math.sqrt(2) * self.z_clip**2,
        )


def row_clip_for(representation: str, row_clip: float | None) -> float:
    """C: the configured value, else the representation's natural bound (norm-1 rows)."""
    if row_clip is not None:
        return float(row_clip)
    if representation in NATURAL_CLIP:
        return NATURAL_CLIP[representation]
    raise ValueError(
        f"row_clip: the {representation!r} representation has no natural row bound; set one"
    )


def plan_disclosure(
    epsilon: float,
    delta: float,
    n_features: int,
    representation: str,
    row_clip: float | None = None,
    shares: tuple[float, float, float] = DEFAULT_SHARES,
    with_basis: bool = True,
) -> DisclosurePlan:
    """``with_basis=False`` (a JL projection needs no basis): the scaling alone, at all of ε."""
    if not (len(shares) == 3 and all(w > 0 for w in shares)):
        raise ValueError("shares: three positive weights")
    used = shares if with_basis else (shares[0], shares[1], 0.0)
    total = sum(used)
    sigma = calibrate_sigma(epsilon, delta, "analytic")
    sigmas = tuple(sigma / math.sqrt(w / total) if w > 0 else math.inf for w in used)
    plan = DisclosurePlan(
        epsilon,
        delta,
        row_clip_for(representation, row_clip),
        Z_CLIP * math.sqrt(n_features),
        sigmas,  # type: ignore[arg-type]
    )
    # checked before anything is charged: a noise the sampler refuses (or one that underflows
    # to 0) would fail only after the charge
    drawn = [std for std, sig in zip(plan.noise_stds(), sigmas, strict=True) if sig < math.inf]
    if not all(MIN_GAUSSIAN_STD <= std < math.inf for std in drawn):
        raise ValueError("row_clip: too small or too large for the noise to be drawn")
    return plan


@dataclass(frozen=True)
class Disclosure:
    scaling: Scaling
    basis: np.ndarray  # (k, ℓ) orthonormal
    clip_norm: float  # RMS norm of the projected rows, from the noisy covariance
    plan: DisclosurePlan
    # the variance of the rows along each basis direction, from the noisy covariance (ℓ,)
    variances: np.ndarray = field(default_factory=lambda: np.zeros(0))


def _clip(x: np.ndarray, c: float) -> np.ndarray:
    """Rows clipped to L2 norm ``c``; a row with a non-finite entry (or whose norm overflows)
    becomes the zero row first, so that nothing non-finite reaches the noise
    (docs/privacy-model.md, "The target owns its privacy too")."""
    x = np.where(np.isfinite(x).all(axis=1, keepdims=True), x, 0.0)
    with np.errstate(over="ignore"):
        norms = np.linalg.norm(x, axis=1, keepdims=True)
    x = np.where(np.isfinite(norms), x, 0.0)
    norms = np.where(np.isfinite(norms), norms, 0.0)
    return np.asarray(x * np.minimum(1.0, c / np.maximum(norms, 1e-300)))


def dp_scaling(r: np.ndarray, plan: DisclosurePlan, mode: str, rng: np.random.Generator) -> Scaling:
    """Steps 2–4: DP column statistics of rows ``r`` already clipped to ``plan.row_clip``."""
    n, k = r.shape
    std_s, std_q, _ = plan.noise_stds()
    mean = (r.sum(axis=0) + gaussian_noise((k,), std_s, rng)) / n
    sq = ((r * r).sum(axis=0) + gaussian_noise((k,), std_q, rng)) / n
    return Scaling.from_moments(mean, np.sqrt(shrunk_variances(sq - mean * mean, std_q / n)), mode)


def shrunk_variances(v: np.ndarray, noise_std: float) -> np.ndarray:
    """Noisy per-column variances pulled toward their mean by how much of their spread the
    noise explains (empirical Bayes; post-processing of DP values and the public noise std):
    all the way to one common scale when the noise dominates, untouched when it is negligible."""
    if v.size < 2:
        return np.asarray(np.maximum(v, 0.0))
    centre = float(np.mean(v))
    spread = max(float(np.var(v)) - noise_std**2, 0.0)
    keep = spread / (spread + noise_std**2) if spread + noise_std**2 > 0 else 1.0
    return np.asarray(np.maximum(centre + keep * (v - centre), 0.0))


def dp_covariance(z: np.ndarray, plan: DisclosurePlan, rng: np.random.Generator) -> np.ndarray:
    """Step 6: Σ z zᵀ plus symmetric Gaussian noise (rows already clipped to ``plan.z_clip``)."""
    k = z.shape[1]
    _, _, std_c = plan.noise_stds()
    upper = np.triu(gaussian_noise((k, k), std_c, rng))
    noise = upper + np.triu(upper, 1).T
    return np.asarray(z.T @ z + noise)


def disclose(
    x: np.ndarray,
    representation: str,
    scaling_mode: str,
    ell: int,
    plan: DisclosurePlan,
    rng: np.random.Generator,
) -> Disclosure:
    """The whole map (module docstring) on the target's raw rows ``x``."""
    n = x.shape[0]
    r = _clip(per_row(x, representation), plan.row_clip)
    scaling = dp_scaling(r, plan, scaling_mode, rng)
    if not plan.with_basis:
        return Disclosure(scaling, np.zeros((x.shape[1], 0)), math.nan, plan)
    z = _clip(scaling.apply(r), plan.z_clip)
    a = dp_covariance(z, plan, rng)
    lam, vec = np.linalg.eigh(a)
    top = np.argsort(lam)[::-1][:ell]
    basis = np.ascontiguousarray(vec[:, top])
    variances = np.maximum(lam[top], 0.0) / n
    clip = math.sqrt(max(float(np.sum(variances)), 1e-12))
    return Disclosure(scaling, basis, clip, plan, variances)


@dataclass(frozen=True)
class RowQueryPlan:
    """``row_queries = "dp"``: one Gaussian mechanism on the m clipped projected rows sent to the
    teachers (module docstring); public, so the source can recompute the charge."""

    epsilon: float
    delta: float
    noise_multiplier: float  # σ_r, over the replace-one sensitivity 2C

    def events(self) -> list[dp_event.DpEvent]:
        return [dp_event.GaussianDpEvent(self.noise_multiplier)]

    def noise_std(self, clip: float) -> float:
        return self.noise_multiplier * 2.0 * clip


def plan_row_queries(epsilon: float, delta: float) -> RowQueryPlan:
    return RowQueryPlan(epsilon, delta, calibrate_sigma(epsilon, delta, "analytic"))


def noisy_rows(
    rows: np.ndarray, clip: float, plan: RowQueryPlan, rng: np.random.Generator
) -> np.ndarray:
    """The queries of ``row_queries = "dp"``: ``rows`` (projected target rows, drawn without
    looking at the data) clipped to ``clip`` plus N(0, (σ_r·2·clip)²). A clip that is not finite
    and positive, or whose noise the sampler refuses, is a ``ValueError`` before any draw."""
    noise = gaussian_noise(rows.shape, query_noise_std(plan, clip), rng)
    return np.asarray(_clip(rows, clip) + noise)


def query_noise_std(plan: RowQueryPlan, clip: float) -> float:
    """σ_r·2·clip, or a ``ValueError`` (checked before any charge) for a clip that is not finite
    and positive or whose noise the sampler would refuse."""
    if not (math.isfinite(clip) and clip > 0):
        raise ValueError(f"clip_norm: {clip!r} is not a finite positive number")
    std = plan.noise_std(clip)
    if not (MIN_GAUSSIAN_STD <= std < math.inf):
        raise ValueError("clip_norm: too small or too large for the noise to be drawn")
    return std


def synthetic_queries(variances: np.ndarray, m: int, rng: np.random.Generator) -> np.ndarray:
    """The queries of ``row_queries = "synthetic"``: m draws of N(0, diag(variances)) in the
    projected coordinates (the rows are centred by the released scaling). Post-processing of
    released values; not noise for a guarantee, so the generator need not be the CSPRNG."""
    v = np.maximum(np.asarray(variances, dtype=np.float64), 0.0)
    return np.asarray(rng.standard_normal((m, v.size)) * np.sqrt(v))
