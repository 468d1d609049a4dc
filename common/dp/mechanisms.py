"""Noise samplers and sensitivities: the only place where privacy noise is drawn.

Every sampler takes ``rng: np.random.Generator``. Production code builds it with
``dpda.dp.rng.secure_rng()`` (seeded from ``secrets``); tests pass ``np.random.default_rng(0)``.
The global ``np.random`` state is never used.

Neighbouring relations and units (docs/privacy-model.md, "Every mechanism at a glance")
-------------------------------------------------------------------------------------
* ``add-remove`` (default): datasets differ by one record; a removed record counts as a zero row
  for per-row releases; ``ns`` and all mechanism parameters are public metadata.
* ``replace-one``: one record is replaced; every sensitivity below doubles.
* Unit ``attribute``: one feature of one record moves by at most ``b`` (the source policy's
  ``attribute_bound``, in the source's per-row representation). After the target's column
  scaling the L2 sensitivity of ``((x − mean)/std)·M`` is ``b · max_j ‖M_j‖₂ / std_j``
  (``attribute_sensitivity``). The record and its label are in both neighbours.
* Unit ``record``: each *projected* row is clipped to ``‖x·M‖₂ ≤ C`` (M is data-independent,
  so clipping after projecting is a per-row operation); L2 sensitivity of a row = ``C``.
  (Clipping before projecting gives ``C·‖M‖₂``; clipping after is never looser.)
* Aggregate releases (record unit): per-class sums of clipped rows — disjoint classes, so one
  record moves one class sum by at most ``C`` (L2) — and per-class counts (L1 sensitivity 1).
* Label histogram: integer counts, L1 sensitivity 1 (2 under replace-one).
* Enforced non-negative rows (terms ``nonnegative_rows``, source-space aggregates): the source
  maps every row to ``max(x, 0)`` after making it finite and before clipping (one per-row map,
  the same for every row, whatever the data), so every clipped row lies in the non-negative
  orthant and a same-label replacement moves a class sum by at most √2·C, not 2C
  (``aggregate_sensitivity``, ``class_gaussians_sensitivity``).
"""

from __future__ import annotations

import math
from enum import StrEnum
from fractions import Fraction
from typing import Literal

import numpy as np


class Neighbouring(StrEnum):
    ADD_REMOVE = "add-remove"
    REPLACE_ONE = "replace-one"


class PrivacyUnit(StrEnum):
    ATTRIBUTE = "attribute"
    RECORD = "record"


# What a session releases (terms ask, the policy offers): one declaration for every layer.
ReleaseKind = Literal["rows", "prototypes", "class-gaussians", "sinkhorn-synthetic"]
AGGREGATE_RELEASES: tuple[str, ...] = ("prototypes", "class-gaussians", "sinkhorn-synthetic")


def relation_factor(relation: Neighbouring | str) -> int:
    """Sensitivity multiplier of a neighbouring relation: 1 (add/remove) or 2 (replace-one)."""
    return 2 if Neighbouring(relation) is Neighbouring.REPLACE_ONE else 1


def jl_matrix(k: int, ell: int, rng: np.random.Generator) -> np.ndarray:
    """Johnson–Lindenstrauss matrix ``M ~ N(0, 1/ℓ)^{k×ℓ}`` (Algorithm 1). Data-independent."""
    if k < 1 or ell < 1:
        raise ValueError("projection shape must be positive")
    return rng.normal(0.0, 1.0 / np.sqrt(ell), size=(k, ell))


def check_projection(m: np.ndarray, k: int, orthonormal: bool) -> None:
    """Validate a projection received from a peer or built locally (no data values in errors)."""
    if m.ndim != 2 or m.shape[0] != k or m.shape[1] < 1 or m.shape[1] > k:
        raise ValueError("projection has the wrong shape")
    if not np.all(np.isfinite(m)):
        raise ValueError("projection has non-finite entries")
    if orthonormal and (
        # an orthonormal column has every entry in [-1, 1]; checked first, so that the Gram
        # matrix below cannot overflow on a peer's huge entries (found by the fuzzer)
        float(np.max(np.abs(m))) > 1.0 + 1e-6
        or not np.allclose(m.T @ m, np.eye(m.shape[1]), atol=1e-6)
    ):
        raise ValueError("projection columns are not orthonormal")


def projection_sensitivity(
    m: np.ndarray,
    unit: PrivacyUnit | str,
    relation: Neighbouring | str,
    *,
    feature_bound: float = 1.0,
    clip_norm: float = 1.0,
    nonnegative: bool = False,
) -> float:
    """L2 sensitivity of one released row ``x·M`` (no column scaling; see module doc).

    Record unit: rows clipped to C, so ``C`` (add/remove) or ``2C`` (replace-one); with
    ``nonnegative`` (rows the source maps into the non-negative orthant, source space only)
    replace-one is ``√2·C`` (``aggregate_sensitivity``). Attribute unit: the attribute relation
    is its own (one feature moves by ≤ b; the record stays), so no relation factor applies:
    ``b · max_j ‖M_j‖`` (``attribute_sensitivity`` with unit scale).
    """
    unit = PrivacyUnit(unit)
    if unit is PrivacyUnit.ATTRIBUTE:
        return attribute_sensitivity(m, np.ones(m.shape[0]), feature_bound)
    if not (np.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError("clip_norm must be > 0")
    return aggregate_sensitivity(relation, clip_norm, nonnegative)


def aggregate_sensitivity(
    relation: Neighbouring | str, clip_norm: float, nonnegative: bool = False
) -> float:
    """L2 sensitivity of one record's row in a sum of rows clipped to ‖x‖ ≤ C (same class).

    * add/remove: the row appears or not, ``C``.
    * replace-one: x → x′ moves the sum by ``‖x − x′‖ ≤ ‖x‖ + ‖x′‖ ≤ 2C`` (x′ = −x attains it).
    * replace-one with enforced non-negative rows (``nonnegative``: the source maps every row
      to ``max(x, 0)`` before clipping, so x, x′ ≥ 0 coordinate-wise for *every* dataset):

          ‖x − x′‖² = ‖x‖² + ‖x′‖² − 2⟨x, x′⟩ ≤ 2C²,  since ⟨x, x′⟩ = Σ x_i x′_i ≥ 0,

      so ``√2·C``, attained by two orthogonal rows of norm C (x = C·e₁, x′ = C·e₂). Clipping
      scales a row by a positive factor and so keeps it non-negative. Add/remove stays ``C``
      (one row of norm C). The bound is a property of the *mechanism* (the clamp runs on every
      row of every dataset), never of the data: a source that switched it on after looking at
      its rows would leak that bit.
    """
    if not (np.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError("clip_norm must be > 0")
    if Neighbouring(relation) is Neighbouring.ADD_REMOVE:
        return float(clip_norm)
    return float((math.sqrt(2.0) if nonnegative else 2.0) * clip_norm)


def nonnegative_rows(x: np.ndarray) -> np.ndarray:
    """Every row mapped into the non-negative orthant, ``max(x, 0)`` entry by entry, after
    rows with a non-finite entry became zero rows (``finite_rows``): one per-row map applied
    to every row, so the √2·C bound of ``aggregate_sensitivity`` holds on every dataset."""
    return np.asarray(np.maximum(finite_rows(np.asarray(x, dtype=np.float64)), 0.0))


#: max ‖x − x′‖² + ‖x∘x − x′∘x′‖² over ‖x‖, ‖x′‖ ≤ 1 (``class_gaussians_sensitivity``)
CLASS_GAUSSIANS_SAME_LABEL_SQUARED = 4.5


#: max ‖u − v‖² + ‖u∘u − v∘v‖² over ‖u‖, ‖v‖ ≤ 1 with u, v ≥ 0 (``class_gaussians_sensitivity``)
CLASS_GAUSSIANS_NONNEGATIVE_SQUARED = 4.0


def class_gaussians_sensitivity(
    relation: Neighbouring | str, label_change: bool = False, nonnegative: bool = False
) -> float:
    """L2 sensitivity of the class-gaussians release, one block ``[x/C, (x∘x)/C²]`` per row
    summed per class (rows clipped to ‖x‖ ≤ C, so u = x/C has ‖u‖ ≤ 1).

    * add/remove: one block moves by ‖[u, u∘u]‖ = √(‖u‖² + Σu_i⁴) ≤ √(1 + ‖u‖⁴) ≤ √2.
    * replace-one, label change (``label_change``): two blocks move by ≤ √2 each: ≤ 2.
    * replace-one, same label: u → v moves one block by (u − v, u∘u − v∘v), and

          max_{‖u‖, ‖v‖ ≤ 1} ‖u − v‖² + ‖u∘u − v∘v‖² = 9/2,  so the sensitivity is 3/√2.

    Proof of ≤ 9/2. Write A_i = u_i², B_i = v_i² (ΣA_i ≤ 1, ΣB_i ≤ 1) and
    P = Σ_i √(A_i B_i) ∈ [0, 1] (Cauchy–Schwarz). Coordinate by coordinate,
    (u_i − v_i)² = A_i + B_i − 2u_i v_i ≤ A_i + B_i + 2√(A_i B_i) and
    (u_i² − v_i²)² = (A_i − B_i)², so the objective is at most

          ΣA + ΣB + 2P + Σ_i (A_i − B_i)².                                     (1)

    Lemma: Σ_i (A_i − B_i)² + 2P² ≤ (ΣA)² + (ΣB)². Expanding both sides, the squares
    A_i², B_i² cancel and so do the products A_i B_i (−2ΣA_iB_i on the left against the 2ΣA_iB_i
    inside 2P²); what remains, term by term for i < j, is 4√(A_i B_i A_j B_j) ≤ 2(A_i A_j +
    B_i B_j), which is AM–GM. With ΣA, ΣB ≤ 1 the lemma gives Σ(A_i − B_i)² ≤ 2 − 2P², and (1)
    is at most 2 + 2P + 2 − 2P² = 4 + 2P(1 − P) ≤ 4 + 1/2 = 9/2 (P(1 − P) ≤ 1/4).

    Attained: u = (cos θ, sin θ), v = (−sin θ, −cos θ) with sin 2θ = 1/2 (θ = 15°): ‖u − v‖² =
    2(1 + sin 2θ) = 3 and ‖u∘u − v∘v‖² = 2cos² 2θ = 3/2. (tests/unit/dp/test_aggregates.py checks
    the bound by numerical optimisation in 2–6 dimensions.) The √6 charged before adds the two
    parts' separate maxima (4 and 2), which no single pair reaches together.

    * replace-one, same label, enforced non-negative rows (``nonnegative``: every row is
      ``max(x, 0)`` before clipping, for every dataset): u, v ≥ 0 coordinate-wise, so
      (u_i − v_i)² ≤ u_i² + v_i² and (u_i² − v_i²)² ≤ u_i⁴ + v_i⁴ (the cross terms 2u_iv_i and
      2u_i²v_i² are ≥ 0), and Σu_i⁴ ≤ (Σu_i²)² ≤ 1: the objective is at most 1 + 1 + 1 + 1 = 4,
      sensitivity 2, attained by u = e₁, v = e₂. The other two cases are unchanged (their
      maxima, a block with u = e₁ and two such blocks, are non-negative already).
    """
    if Neighbouring(relation) is Neighbouring.ADD_REMOVE:
        return math.sqrt(2.0)
    if label_change:
        return 2.0
    if nonnegative:
        return math.sqrt(CLASS_GAUSSIANS_NONNEGATIVE_SQUARED)
    return math.sqrt(CLASS_GAUSSIANS_SAME_LABEL_SQUARED)


def attribute_sensitivity(m: np.ndarray, std: np.ndarray, bound: float) -> float:
    """L2 sensitivity of ``((x − mean) / std)·M`` when one feature of one record moves by ≤ b.

    The change is stated in the source's per-row representation (before the target's scaling):
    feature j moving by b moves the scaled row by b / std_j in coordinate j and the projected
    row by ``b · ‖M_j‖ / std_j``. The maximum over j is the sensitivity of the whole map, so a
    target that sends a tiny std (or a basis concentrated on a low-variance feature) gets
    proportionally more noise, never a smaller unit of privacy. The source clamps the scaled
    values to ±1e100 (``features.prepare_features``): a 1-Lipschitz map per coordinate, so the
    bound still holds, and it keeps every projected value finite (|x·M| ≤ ~1e106), so the
    non-finite-row mapping before clipping never fires under this unit.
    """
    if not (np.isfinite(bound) and bound > 0):
        raise ValueError("attribute bound must be a finite number > 0")
    std = np.asarray(std, dtype=np.float64)
    if std.shape != (m.shape[0],) or not np.all(np.isfinite(std)) or np.any(std <= 0):
        raise ValueError("column scale must be finite and positive, one per feature")
    return float(bound * np.max(np.linalg.norm(m, axis=1) / std))


def finite_rows(x: np.ndarray) -> np.ndarray:
    """Each row with a non-finite entry becomes the zero row (a per-row map, applied *before*
    clipping). Refusing such rows instead would itself tell the peer something about the data;
    letting them through would turn into NaN rows whose count is data (the overflow channel)."""
    bad = ~np.all(np.isfinite(x), axis=1)
    if not np.any(bad):
        return x
    out = np.array(x, dtype=np.float64, copy=True)
    out[bad] = 0.0
    return out


def clip_rows(x: np.ndarray, clip_norm: float) -> np.ndarray:
    """Scale each row down to ``‖x_i‖₂ ≤ C`` (a per-row operation, so DP-clean).

    Rows with non-finite entries become zero rows first; norms are computed on rows divided by
    their largest magnitude, so no intermediate overflows.
    """
    x = finite_rows(np.asarray(x, dtype=np.float64))
    if x.size == 0:
        return x
    peak = np.max(np.abs(x), axis=1, keepdims=True)
    safe = np.where(peak > 0, peak, 1.0)
    unit = x / safe  # entries in [-1, 1]; ‖unit‖ ∈ [1, √ℓ] for non-zero rows
    nu = np.linalg.norm(unit, axis=1, keepdims=True)
    over = peak * nu > clip_norm  # ‖x‖ > C, without forming ‖x‖ (it may overflow)
    clipped = unit * (clip_norm / np.where(nu > 0, nu, 1.0))
    return np.where(over, clipped, x)


def class_sums(z: np.ndarray, y: np.ndarray, n_classes: int) -> np.ndarray:
    """Per-class sums ``(q, d)`` of the rows ``z (n, d)`` (private; leaves only with noise)."""
    out = np.zeros((n_classes, z.shape[1]))
    np.add.at(out, y, z)
    return out


def row_cells(z: np.ndarray, cells: int, rng: np.random.Generator) -> np.ndarray:
    """Each row's cell in ``[0, cells)``: the nearest (largest cosine) of ``cells`` directions
    drawn from ``rng`` before any row is read, so the partition is independent of the data.

    Summing per (class, cell) instead of per class keeps the sums' sensitivity: under
    replace-one a record's row leaves one (class, cell) sum and enters one, each moved by
    ≤ C, exactly as a label change moves two class sums (√2·C together, and at most 2C when it
    stays in its sum: ``aggregate_sensitivity``); add/remove moves one sum by ≤ C. The cell
    counts are a histogram over (class, cell) in which one record moves one or two bins, as
    the class counts over classes. Every bound holds for every fixed partition, hence for one
    drawn independently of the rows. A zero row (a non-finite row made finite) falls in cell 0.
    """
    if cells <= 1:
        return np.zeros(z.shape[0], dtype=np.int64)
    d = rng.standard_normal((z.shape[1], cells))
    d /= np.linalg.norm(d, axis=0, keepdims=True)
    return np.asarray(np.argmax(z @ d, axis=1), dtype=np.int64)


def fold_cells(counts: np.ndarray, n_classes: int) -> np.ndarray:
    """Per-(class, cell) counts ``(q · cells,)``, class-major, summed to per-class ``(q,)``;
    per-class counts as they are."""
    counts = np.asarray(counts)
    if counts.size == n_classes or n_classes < 1:
        return counts
    return np.asarray(counts.reshape(n_classes, -1).sum(axis=1))


#: Floor on σ for :func:`gaussian_noise`: a positive std below it is refused. ``rng.normal``
#: draws ``std · N(0,1)``; at such scales the products sit in or near the subnormal range and
#: the noise would be lost to rounding when added to any value (a "noisy" release equal to the
#: exact one). ``std == 0`` stays allowed for the noise-free baselines of the benchmarks.
MIN_GAUSSIAN_STD = 1e-200


def gaussian_noise(shape: tuple[int, ...], std: float, rng: np.random.Generator) -> np.ndarray:
    """I.i.d. ``N(0, std²)`` noise; ``std`` is absolute (noise multiplier × sensitivity).

    Refused (``ValueError``) for a non-finite or negative std and for ``0 < std <
    MIN_GAUSSIAN_STD``; ``std == 0`` (no noise) is accepted for the benchmarks' noise-free
    baselines only — no release path computes it.
    """
    std = float(std)
    if not (math.isfinite(std) and std >= 0):
        raise ValueError("noise std must be finite and ≥ 0")
    if 0 < std < MIN_GAUSSIAN_STD:
        raise ValueError(f"noise std below the floor {MIN_GAUSSIAN_STD:g}: lost to rounding")
    return rng.normal(0.0, std, size=shape)


# ---------------------------------------------------------------------------- discrete Laplace
#: Floor on the DLap parameter a (pmf ∝ exp(−a|x|)); smaller values are refused. At the floor
#: the noise std is ≈ √2/a ≈ 1414 counts, already far beyond any useful histogram, so a smaller
#: a only arises from a mistake (ε in the wrong unit, a tiny share). Down to the floor the sampler
#: below stays exact and runs in O(1) expected time per draw, with every intermediate integer
#: below 2^62 (see :func:`discrete_laplace_noise`).
MIN_DISCRETE_LAPLACE_PARAMETER = 1e-3
#: Ceiling on a (ε ≤ 100 in the session terms, so a ≤ 100 in practice). It keeps the numerator
#: s ≤ a·t < 2^52 so that every integer of the sampler is an exact int64.
MAX_DISCRETE_LAPLACE_PARAMETER = 2.0**20
#: Largest denominator t of the rational s/t the sampler uses. The rational is the largest one
#: ≤ a with t ≤ 2^32 (the lower Farey neighbour of a of that order; the upper one, t', is
#: 1/(t·t') away and t' ≥ 1), so 0 ≤ a − s/t ≤ 2^-32: a relative change of at most 2^-32/a
#: (≤ 2.4e-7 at the floor, ≤ 2.4e-10 at a = 1), always towards more noise.
DISCRETE_LAPLACE_MAX_DENOMINATOR = 2**32
_INT64_SAFE = 2**62


def _check_discrete_laplace_parameter(parameter: float) -> float:
    a = float(parameter)
    if not math.isfinite(a):
        raise ValueError("discrete Laplace parameter must be finite")
    if a < MIN_DISCRETE_LAPLACE_PARAMETER:
        raise ValueError(
            f"discrete Laplace parameter below the floor {MIN_DISCRETE_LAPLACE_PARAMETER:g} "
            "(refused: no exact sampler is offered there)"
        )
    if a > MAX_DISCRETE_LAPLACE_PARAMETER:
        raise ValueError(
            f"discrete Laplace parameter above the ceiling {MAX_DISCRETE_LAPLACE_PARAMETER:g}"
        )
    return a


def _largest_rational_at_most(x: Fraction, max_den: int) -> Fraction:
    """The largest p/q ≤ x with 1 ≤ q ≤ max_den (the lower Farey neighbour of x of that order).

    Same continued-fraction walk as ``Fraction.limit_denominator``, which ends with the two
    best approximations of x with denominator ≤ max_den on either side of x (the last
    convergent and the last admissible semiconvergent); ``limit_denominator`` returns the
    *closer* one, which may lie above x (e.g. 7/10 > float(0.7)), so we take the one below.
    """
    if x.denominator <= max_den:
        return x
    p0, q0, p1, q1 = 0, 1, 1, 0
    n, d = x.numerator, x.denominator
    while True:
        a = n // d
        q2 = q0 + a * q1
        if q2 > max_den:
            break
        p0, q0, p1, q1 = p1, q1, p0 + a * p1, q2
        n, d = d, n - a * d
    k = (max_den - q0) // q1
    bound1 = Fraction(p0 + k * p1, q0 + k * q1)
    bound2 = Fraction(p1, q1)
    low = bound1 if bound1 <= x else bound2
    assert low <= x and low.denominator <= max_den
    return low


def discrete_laplace_rational(parameter: float) -> Fraction:
    """The exact rational s/t that :func:`discrete_laplace_noise` uses for the parameter a.

    The float a (from ε/Δ) is read exactly (``Fraction(a)``, a dyadic rational) and replaced by
    the largest s/t ≤ a with t ≤ ``DISCRETE_LAPLACE_MAX_DENOMINATOR``. Rounding *down* means
    more noise: DLap(s/t) is (s/t·Δ)-DP ⊆ (a·Δ)-DP, so the ledger's ε = a·Δ is never
    under-stated. (``limit_denominator`` alone rounds to the nearest, which can be above a:
    float(0.7) < 7/10.) Raises ``ValueError`` outside [floor, ceiling] or for non-finite a.
    """
    a = _check_discrete_laplace_parameter(parameter)
    r = _largest_rational_at_most(Fraction(a), DISCRETE_LAPLACE_MAX_DENOMINATOR)
    if r <= 0 or r > Fraction(a):  # cannot happen at a ≥ floor ≫ 1/max_den
        raise ValueError("discrete Laplace parameter has no admissible rational")
    return r


def _bernoulli_exp_fraction(num: np.ndarray, den: int, rng: np.random.Generator) -> np.ndarray:
    """Vectorised Bernoulli(exp(−num_i/den)) for integers 0 ≤ num_i ≤ den (γ_i ∈ [0, 1]).

    Canonne, Kamath & Steinke 2020, Algorithm 1, case γ ≤ 1: K ← 1; while Bernoulli(γ/K): K += 1;
    return K odd. Bernoulli(γ/K) is drawn as Bernoulli(num/den) ∧ Bernoulli(1/K) with two
    independent exact uniform integers (``integers(0, den) < num`` and ``integers(0, K) == 0``):
    the product of the probabilities is γ/K and no product den·K is ever formed. All elements
    still running share the same K, so each round is one pair of array draws.
    """
    m = num.size
    out = np.empty(m, dtype=bool)
    idx = np.arange(m)
    nums = num
    k = 1
    while idx.size:
        go = rng.integers(0, den, size=idx.size) < nums
        if k > 1:
            go &= rng.integers(0, k, size=idx.size) == 0
        out[idx[~go]] = k % 2 == 1
        idx, nums = idx[go], nums[go]
        k += 1
    return out


def _bernoulli_exp_minus_one(m: int, rng: np.random.Generator) -> np.ndarray:
    """``m`` i.i.d. Bernoulli(exp(−1)) (Algorithm 1 with γ = 1: Bernoulli(1/K) rounds)."""
    out = np.empty(m, dtype=bool)
    idx = np.arange(m)
    k = 2  # K = 1: Bernoulli(1/1) always continues
    while idx.size:
        go = rng.integers(0, k, size=idx.size) == 0
        out[idx[~go]] = k % 2 == 1
        idx = idx[go]
        k += 1
    return out


def discrete_laplace_noise(
    shape: tuple[int, ...], parameter: float, rng: np.random.Generator
) -> np.ndarray:
    """Exact DLap(a) noise, ``P(x) = tanh(a/2)·exp(−a|x|)`` on the integers, as int64.

    *Exact or refused*: a is first replaced by the rational s/t ≤ a of
    :func:`discrete_laplace_rational` (``ValueError`` below ``MIN_DISCRETE_LAPLACE_PARAMETER``,
    above the ceiling, or non-finite, before anything is drawn); the draws are then exactly
    DLap(s/t), using only uniform integers (``rng.integers``, exact) — no floats, no geometric
    sampler that saturates at INT64_MAX, no subtraction that can wrap.

    Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy",
    Algorithm 2 (discrete Laplace of scale t/s), vectorised as rejection rounds over arrays:
    U ~ U{0..t−1}; keep with Bernoulli(exp(−U/t)) (Algorithm 1); V ~ Geometric(1 − e^{−1}) by
    repeated Bernoulli(exp(−1)); X = U + t·V; Y = ⌊X/s⌋; B ~ Bernoulli(1/2); reject B = 1 ∧
    Y = 0, else return (1 − 2B)·Y. Rejected elements restart; each round keeps a constant
    fraction, so the expected work per draw is O(1) for every s/t.

    Integer range: t ≤ 2^32 and s < 2^52, and X < 2^62 unless V exceeds ~2^30, which needs 2^30
    consecutive Bernoulli(e^{−1}) successes (probability e^{−2^30}); that case raises
    ``OverflowError`` rather than wrap.
    """
    r = discrete_laplace_rational(parameter)
    s, t = r.numerator, r.denominator
    size = math.prod(shape)
    out = np.zeros(size, dtype=np.int64)
    v_max = (_INT64_SAFE - t) // t
    pending = np.arange(size)
    while pending.size:
        u = rng.integers(0, t, size=pending.size, dtype=np.int64)
        keep = _bernoulli_exp_fraction(u, t, rng)
        idx, u = pending[keep], u[keep]
        rejected = [pending[~keep]]
        v = np.zeros(idx.size, dtype=np.int64)
        going = np.arange(idx.size)
        while going.size:
            a = _bernoulli_exp_minus_one(going.size, rng)
            going = going[a]
            v[going] += 1
            if going.size and int(v[going[0]]) > v_max:
                raise OverflowError("discrete Laplace draw out of the int64 range")
        y = (u + t * v) // s
        b = rng.integers(0, 2, size=idx.size) == 1
        bad = b & (y == 0)
        good = ~bad
        out[idx[good]] = np.where(b[good], -y[good], y[good])
        rejected.append(idx[bad])
        pending = np.concatenate(rejected)
    return out.reshape(shape)


def discrete_laplace_variance(parameter: float) -> float:
    """Variance of the noise :func:`discrete_laplace_noise` draws for ``parameter``: that of
    DLap(r) for the rational r = s/t it actually uses, ``2e^{−r} / (1 − e^{−r})²``."""
    r = float(discrete_laplace_rational(parameter))
    return float(2.0 * math.exp(-r) / math.expm1(-r) ** 2)


def label_counts(labels: np.ndarray, n_classes: int) -> np.ndarray:
    """Exact class counts (private; only ever leaves through a noisy mechanism)."""
    return np.bincount(labels, minlength=n_classes).astype(np.int64)


def counts_to_labels(noisy_counts: np.ndarray, n_rows: int) -> np.ndarray:
    """Post-processing: noisy counts → one label per label-sorted row.

    Negative counts are clipped to 0, the rest rescaled to sum exactly to ``n_rows`` with the
    largest-remainder rule; labels come out as contiguous blocks in class order. Uses only the
    released counts and the (public) number of released rows.
    """
    c = np.clip(np.asarray(noisy_counts, dtype=float), 0.0, None)
    q = c.size
    if n_rows == 0:
        return np.zeros(0, dtype=np.int64)
    if c.sum() <= 0:
        c = np.ones(q)
    share = c * (n_rows / c.sum())
    base = np.floor(share).astype(np.int64)
    rest = n_rows - int(base.sum())
    if rest > 0:
        order = np.argsort(-(share - base), kind="stable")
        base[order[:rest]] += 1
    return np.repeat(np.arange(q, dtype=np.int64), base)
