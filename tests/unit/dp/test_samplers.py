"""Exact-or-refused samplers (DLap via Canonne–Kamath–Steinke) and the CSPRNG generators."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from randomgen import AESCounter, ChaCha  # type: ignore[import-untyped]
from scipy import stats

from dpda.dp import mechanisms as mech
from dpda.dp import rng as rng_mod
from dpda.dp.mechanisms import (
    DISCRETE_LAPLACE_MAX_DENOMINATOR,
    MAX_DISCRETE_LAPLACE_PARAMETER,
    MIN_DISCRETE_LAPLACE_PARAMETER,
    MIN_GAUSSIAN_STD,
    discrete_laplace_noise,
    discrete_laplace_rational,
    discrete_laplace_variance,
    gaussian_noise,
)
from dpda.dp.rng import is_cryptographic, make_rng, public_rng, secure_rng

FLOOR = MIN_DISCRETE_LAPLACE_PARAMETER


# ------------------------------------------------------------------------------ helpers
def _tail(r: float, k: int) -> float:
    """P(X ≥ k) for X ~ DLap(r), k ≥ 1: e^{−rk} / (1 + e^{−r})."""
    return math.exp(-r * k) / (1.0 + math.exp(-r))


def _chi2_pvalue(x: np.ndarray, r: float, n_bins: int = 40) -> float:
    """Chi-square goodness of fit of ``x`` to DLap(r), on bins of |x| with ≥ ~0.5% mass each
    (the sign is tested separately: bins are {0}, then ±[k_j, k_{j+1}) for each side)."""
    n = x.size
    # positive-side edges: 1 = k_0 < k_1 < ... chosen by the exact tail, then the open tail
    targets = np.linspace(0, 1, n_bins + 1)[1:-1]
    t1 = _tail(r, 1)
    edges = [1]
    for q in targets:
        k = int(math.ceil(-math.log(t1 * (1 - q) * (1 + math.exp(-r))) / r))
        if k > edges[-1]:
            edges.append(k)
    obs, exp = [np.sum(x == 0)], [n * math.tanh(r / 2)]
    for sign in (1, -1):
        y = sign * x
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            obs.append(np.sum((y >= lo) & (y < hi)))
            exp.append(n * (_tail(r, lo) - _tail(r, hi)))
        obs.append(np.sum(y >= edges[-1]))
        exp.append(n * _tail(r, edges[-1]))
    obs_a, exp_a = np.array(obs, dtype=float), np.array(exp)
    assert exp_a.min() > 20, "bins too thin for a chi-square test"
    exp_a *= n / exp_a.sum()  # absorb float rounding of the exact masses
    return float(stats.chisquare(obs_a, exp_a).pvalue)


def _dlap_var(r: float) -> float:
    return 2.0 * math.exp(-r) / math.expm1(-r) ** 2


# ------------------------------------------------------------------ (a) the exact DLap law
@pytest.mark.parametrize(("a", "seed"), [(1.0, 11), (0.05, 12), (FLOOR, 13)])
def test_discrete_laplace_pmf_matches(a: float, seed: int) -> None:
    n = 200_000
    x = discrete_laplace_noise((n,), a, np.random.default_rng(seed))
    assert x.dtype == np.int64 and x.shape == (n,)
    r = float(discrete_laplace_rational(a))
    assert _chi2_pvalue(x, r) > 1e-4
    var = _dlap_var(r)
    assert discrete_laplace_variance(a) == pytest.approx(var, rel=1e-12)
    assert abs(x.mean()) < 5 * math.sqrt(var / n)
    assert x.var() == pytest.approx(var, rel=0.03)  # sd of the estimate ≈ 0.5%
    # per-value check of P(0) = tanh(a/2) with a Clopper–Pearson interval
    ci = stats.binomtest(int(np.sum(x == 0)), n).proportion_ci(0.9999, method="exact")
    assert ci.low <= math.tanh(r / 2) <= ci.high
    # the sign is a fair coin given x ≠ 0
    nz = x[x != 0]
    assert stats.binomtest(int(np.sum(nz > 0)), nz.size).pvalue > 1e-4


def test_chi2_has_power() -> None:
    """The same check rejects a law with a 10% larger parameter (so a 'pass' means something)."""
    x = discrete_laplace_noise((200_000,), 1.1, np.random.default_rng(14))
    assert _chi2_pvalue(x, 1.0) < 1e-6


@pytest.mark.parametrize(("num", "den"), [(0, 7), (1, 3), (5, 7), (1, 1), (2**31, 2**32)])
def test_bernoulli_exp_building_blocks(num: int, den: int) -> None:
    n = 100_000
    g = np.random.default_rng(num + den)
    hits = mech._bernoulli_exp_fraction(np.full(n, num, dtype=np.int64), den, g)
    p = math.exp(-num / den)
    if num == 0:
        assert hits.all()
    else:
        ci = stats.binomtest(int(hits.sum()), n).proportion_ci(0.9999, method="exact")
        assert ci.low <= p <= ci.high
    ones = mech._bernoulli_exp_minus_one(n, g)
    ci = stats.binomtest(int(ones.sum()), n).proportion_ci(0.9999, method="exact")
    assert ci.low <= math.exp(-1) <= ci.high


def test_shapes_and_empty() -> None:
    g = np.random.default_rng(0)
    assert discrete_laplace_noise((3, 4), 1.0, g).shape == (3, 4)
    assert discrete_laplace_noise((0,), 1.0, g).shape == (0,)
    assert discrete_laplace_noise((), 1.0, g).shape == ()


# ----------------------------------------------------------------- (b) refused before drawing
@pytest.mark.parametrize(
    "a",
    [
        1e-25,
        1e-30,
        1e-19,
        0.0,
        -1.0,
        float(np.nextafter(FLOOR, 0)),
        FLOOR / 2,
        float("nan"),
        float("inf"),
        -float("inf"),
        MAX_DISCRETE_LAPLACE_PARAMETER * 2,
    ],
)
def test_out_of_range_parameter_refused_before_drawing(a: float) -> None:
    for g in (np.random.default_rng(0), secure_rng()):
        before = g.bit_generator.state
        with pytest.raises(ValueError, match="discrete Laplace parameter"):
            discrete_laplace_noise((10,), a, g)
        after = g.bit_generator.state
        assert str(after) == str(before)  # nothing drawn
    with pytest.raises(ValueError, match="discrete Laplace parameter"):
        discrete_laplace_rational(a)
    with pytest.raises(ValueError, match="discrete Laplace parameter"):
        discrete_laplace_variance(a)


def test_below_floor_message() -> None:
    with pytest.raises(ValueError, match="below the floor"):
        discrete_laplace_noise((10,), 1e-25, np.random.default_rng(0))


def test_floor_itself_accepted() -> None:
    x = discrete_laplace_noise((10,), FLOOR, secure_rng())
    assert x.dtype == np.int64


# ------------------------------------------------------------------ (c) rational never above a
@pytest.mark.parametrize(
    "a", [FLOOR, 0.7, 0.1, 1 / 3, 1.0, 2.0, 0.05, 1e-2, math.pi, 100.0, 0.5 * 0.7]
)
def test_rational_at_most_parameter(a: float) -> None:
    r = discrete_laplace_rational(a)
    assert isinstance(r, Fraction)
    assert 0 < r <= Fraction(a)  # never less noise than the float a states
    assert r.denominator <= DISCRETE_LAPLACE_MAX_DENOMINATOR
    # Farey neighbours of order D are 1/(t·t') apart with t' ≥ 1: a − r ≤ 1/D
    assert Fraction(a) - r <= Fraction(1, DISCRETE_LAPLACE_MAX_DENOMINATOR)


def test_rational_examples() -> None:
    assert discrete_laplace_rational(1.0) == 1
    assert discrete_laplace_rational(2.0) == 2
    assert discrete_laplace_rational(0.5) == Fraction(1, 2)
    # float(0.7) < 7/10: the nearest rational would be above a; the sampler steps below
    assert Fraction(0.7) < Fraction(7, 10)
    assert Fraction(0.7).limit_denominator(DISCRETE_LAPLACE_MAX_DENOMINATOR) > Fraction(0.7)
    assert discrete_laplace_rational(0.7) < Fraction(0.7)


@settings(max_examples=300, deadline=None)
@given(a=st.floats(min_value=FLOOR, max_value=100.0, allow_nan=False))
def test_rational_never_exceeds_property(a: float) -> None:
    r = discrete_laplace_rational(a)
    assert 0 < r <= Fraction(a)
    assert r.denominator <= DISCRETE_LAPLACE_MAX_DENOMINATOR
    assert Fraction(a) - r <= Fraction(1, DISCRETE_LAPLACE_MAX_DENOMINATOR)


@settings(max_examples=300, deadline=None)
@given(
    num=st.integers(1, 10**12),
    den=st.integers(1, 10**12),
    max_den=st.integers(1, 60),
)
def test_largest_rational_at_most_is_optimal(num: int, den: int, max_den: int) -> None:
    x = Fraction(num, den)
    got = mech._largest_rational_at_most(x, max_den)
    best = max(Fraction(math.floor(x * q), q) for q in range(1, max_den + 1))
    assert got == best


# ---------------------------------------------------------- (d) no int64 overflow at the floor
def test_no_overflow_or_saturation_at_floor() -> None:
    n = 200_000
    x = discrete_laplace_noise((n,), FLOOR, np.random.default_rng(21))
    assert x.dtype == np.int64
    # P(|X| ≥ k) ≈ e^{−ak}: max |X| over 2·10⁵ draws is ≈ ln(n)/a ≈ 12,000; 60/a is never hit
    assert int(np.abs(x).max()) < 60 / FLOOR < 2**62
    assert np.unique(x).size > 1000  # not saturated into a constant
    assert int(np.sum(x > 0)) > 0 and int(np.sum(x < 0)) > 0


# ----------------------------------------------------------------------------- gaussian floor
@pytest.mark.parametrize("std", [float("nan"), float("inf"), -1.0, 1e-300, MIN_GAUSSIAN_STD / 2])
def test_gaussian_refuses_bad_std(std: float) -> None:
    g = np.random.default_rng(0)
    before = str(g.bit_generator.state)
    with pytest.raises(ValueError):
        gaussian_noise((5,), std, g)
    assert str(g.bit_generator.state) == before


def test_gaussian_accepts_zero_and_floor() -> None:
    g = np.random.default_rng(0)
    assert np.all(gaussian_noise((5,), 0.0, g) == 0)
    assert gaussian_noise((5,), MIN_GAUSSIAN_STD, g).shape == (5,)


# -------------------------------------------------------------------- (e) CSPRNG generators
def _stream(g: np.random.Generator) -> list[int]:
    return g.integers(0, 2**63, size=8).tolist()


def test_secure_rng_is_chacha20() -> None:
    g = secure_rng()
    assert isinstance(g, np.random.Generator)
    assert type(g.bit_generator) is ChaCha
    assert g.bit_generator.state["state"]["rounds"] == 20


def test_secure_rng_streams_differ() -> None:
    assert _stream(secure_rng()) != _stream(secure_rng())
    p, s = public_rng(), secure_rng()
    assert type(p.bit_generator) is ChaCha
    assert p.bit_generator is not s.bit_generator
    assert _stream(p) != _stream(s)


def test_secure_rng_uses_full_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The 256 bits from ``secrets`` are the ChaCha key itself (``key=``, not ``seed=``)."""
    key = (0x0123456789ABCDEF << 192) | (0xFEDCBA9876543210 << 128) | (0xDEADBEEF << 64) | 7
    calls: list[int] = []

    def fake_randbits(k: int) -> int:
        calls.append(k)
        return key

    monkeypatch.setattr(rng_mod.secrets, "randbits", fake_randbits)
    g = secure_rng()
    assert calls == [256]
    words = g.bit_generator.state["state"]["keysetup"]
    assert [int(w) for w in words] == [(key >> (32 * i)) & 0xFFFFFFFF for i in range(8)]
    same = np.random.Generator(ChaCha(key=key, rounds=20))
    assert _stream(g) == _stream(same)


def test_make_rng() -> None:
    assert is_cryptographic(make_rng(None))
    a, b = make_rng(5), make_rng(5)
    assert _stream(a) == _stream(b)  # reproducible
    assert _stream(make_rng(0)) == _stream(np.random.default_rng(0))  # tests keep their numbers


# -------------------------------------------------------------------- (f) is_cryptographic
def test_is_cryptographic() -> None:
    assert is_cryptographic(secure_rng())
    assert is_cryptographic(public_rng())
    assert is_cryptographic(np.random.Generator(AESCounter(key=12345)))
    assert not is_cryptographic(np.random.default_rng(0))
    assert not is_cryptographic(make_rng(0))
    assert not is_cryptographic(np.random.Generator(np.random.Philox(0)))
    assert not is_cryptographic(np.random.Generator(ChaCha(key=1, rounds=8)))
    assert not is_cryptographic(np.random.RandomState(0))  # type: ignore[arg-type]
    assert not is_cryptographic(None)  # type: ignore[arg-type]
