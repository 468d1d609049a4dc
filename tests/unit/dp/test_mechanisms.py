from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling
from dpda.dp.events import RevealedSampledGaussianDpEvent
from dpda.dp.ledger import Budget
from dpda.dp.mechanisms import (
    clip_rows,
    counts_to_labels,
    discrete_laplace_noise,
    discrete_laplace_variance,
    jl_matrix,
    projection_sensitivity,
)
from dpda.policy import PrivacyPolicy
from dpda.protocol import TargetDisclosure
from dpda.terms import SessionTerms
from tests.support import memory_releaser
from tests.unit.noise_checks import std_matches


def test_jl_matrix_scale(rng: np.random.Generator) -> None:
    m = jl_matrix(400, 50, rng)
    assert m.shape == (400, 50)
    assert std_matches(m, 1 / np.sqrt(50))


def test_sensitivities(rng: np.random.Generator) -> None:
    m = jl_matrix(30, 5, rng)
    w = np.linalg.norm(m, axis=1).max()
    spec = np.linalg.norm(m, 2)
    # the attribute relation is its own (one feature moves by ≤ b): no relation factor
    for relation in ("add-remove", "replace-one"):
        assert projection_sensitivity(m, "attribute", relation, feature_bound=2.0) == pytest.approx(
            2 * w
        )
    assert projection_sensitivity(m, "record", "add-remove", clip_norm=3.0) == pytest.approx(3)
    assert projection_sensitivity(m, "record", "replace-one", clip_norm=3.0) == pytest.approx(6)
    assert spec > 0


def test_record_sensitivity_bounds_actual_row_change(rng: np.random.Generator) -> None:
    m = jl_matrix(30, 5, rng)
    z = clip_rows(rng.normal(size=(200, 30)) @ m * 5, 1.0)  # projected, then clipped
    assert np.all(np.linalg.norm(z, axis=1) <= 1.0 + 1e-12)
    s = projection_sensitivity(m, "record", "add-remove", clip_norm=1.0)
    assert np.all(np.linalg.norm(z, axis=1) <= s + 1e-9)


def test_discrete_laplace_distribution(rng: np.random.Generator) -> None:
    a = 0.7
    x = discrete_laplace_noise((200_000,), a, rng)
    assert x.dtype == np.int64
    assert std_matches(x, np.sqrt(discrete_laplace_variance(a)))
    assert np.mean(x == 0) == pytest.approx(np.tanh(a / 2), abs=0.005)
    assert not std_matches(x * 1.3, np.sqrt(discrete_laplace_variance(a)))


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(-50, 500), min_size=1, max_size=12),
    n=st.integers(0, 2000),
)
@pytest.mark.slow
def test_counts_to_labels_properties(counts: list[int], n: int) -> None:
    labels = counts_to_labels(np.array(counts), n)
    assert labels.size == n
    assert np.all(labels >= 0) and np.all(labels < len(counts))
    assert np.all(np.diff(labels) >= 0)  # contiguous blocks in class order
    clipped = np.clip(counts, 0, None)
    if clipped.sum() > 0:
        assert np.all(np.bincount(labels, minlength=len(counts))[clipped == 0] == 0)


def _zero_source(n: int, k: int, q: int) -> Domain:
    """All-zero features: every released value is pure noise, so the noise can be measured."""
    y = np.arange(n) % q
    return Domain("zeros", np.zeros((n, k)), y.astype(np.int64), q)


def _rehearsal(terms: SessionTerms) -> PrivacyPolicy:
    return PrivacyPolicy.rehearsal(terms.privacy_unit, terms.release)


@pytest.mark.parametrize("unit", ["attribute"])  # record-unit noise: test_aggregates.py
def test_release_noise_matches_ledger_claim(unit: str) -> None:
    n, k, q, ell = 2000, 40, 4, 10
    src = _zero_source(n, k, q)
    terms = SessionTerms(
        dataset="z",
        epsilon=4,
        delta=1e-5,
        projection="jl",
        projection_dim=ell,
        privacy_unit=unit,
        release="rows",
    )
    rel, ledger = memory_releaser(
        src, "z", Budget(100, 1e-5), np.random.default_rng(1), policy=_rehearsal(terms)
    )
    info = rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(k), np.ones(k))))
    batch = rel.release(info.session_id, 0)
    entry = ledger.store.entries()[-1]
    spec = entry.params["spec"]
    claimed = spec["features"]["noise_multiplier"] * spec["features"]["sensitivity"]
    # the ledger's sensitivity is the one the projection implies
    m = info.projection
    # attribute: b · max row norm of M / std (unit std here); record under replace-one: 2C
    expected_sens = np.linalg.norm(m, axis=1).max() if unit == "attribute" else 2 * terms.clip_norm
    assert spec["features"]["sensitivity"] == pytest.approx(expected_sens)
    assert std_matches(batch.z, claimed)
    assert not std_matches(batch.z, claimed * 0.7)  # a mechanism with 30% less noise is caught
    assert not std_matches(batch.z, claimed * 1.3)
    assert entry.payload_sha256 == batch.sha256()


def test_histogram_noise_matches_ledger_claim() -> None:
    n, k, q = 24_000, 3, 12_000  # one release, 12,000 noisy counts
    src = _zero_source(n, k, q)
    truth = np.bincount(src.y, minlength=q)
    terms = SessionTerms(
        dataset="z", epsilon=4, delta=1e-5, projection="jl", projection_dim=2
    )  # the default: record unit, prototypes (one noisy count per class)
    rel, ledger = memory_releaser(
        src, "z", Budget(10, 1e-5), np.random.default_rng(2), policy=_rehearsal(terms)
    )
    info = rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(k), np.ones(k))))
    noise = rel.release(info.session_id, 0).noisy_counts - truth
    a = ledger.store.entries()[-1].params["spec"]["histogram"]["parameter"]
    # ε_h = 4 · 0.1 (the aggregates' default share), L1 sensitivity 2 under replace-one
    assert a == pytest.approx(0.2)
    assert ledger.store.entries()[-1].dp_event["type"] == "LabelBranchDpEvent"
    claimed = np.sqrt(discrete_laplace_variance(a))
    assert std_matches(noise, claimed)
    assert not std_matches(noise, claimed * 0.7)
    assert not std_matches(noise, claimed * 1.3)


@pytest.mark.slow
def test_minibatch_sizes_vary_and_noise_matches() -> None:
    n, k, q = 3000, 20, 5
    src = _zero_source(n, k, q)
    terms = SessionTerms(
        dataset="z",
        epsilon=8,
        delta=1e-5,
        projection="jl",
        projection_dim=8,
        batch_size=300,
        steps=20,
        noise_multiplier=0.0,  # calibrated: the smallest σ whose 20 batches spend ε
        privacy_unit="attribute",
    )
    rel, ledger = memory_releaser(
        src, "z", Budget(8, 1e-5), np.random.default_rng(3), policy=_rehearsal(terms)
    )
    info = rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(k), np.ones(k))))
    assert info.plan.sampling_rate == pytest.approx(0.1)
    sizes, zs = [], []
    for i in range(info.plan.steps):
        b = rel.release(info.session_id, i)
        sizes.append(b.z.shape[0])
        zs.append(b.z)
    assert len(set(sizes)) > 1  # Poisson sampling: batch sizes vary
    assert 250 < np.mean(sizes) < 350
    spec = info.plan.spec(terms)
    assert std_matches(np.vstack(zs), spec.features.noise_std)
    assert 0.97 * 8 < ledger.spent("z") <= 8  # the calibration spends the budget, no more
    h = spec.histogram  # uncharged under the attribute relation (labels do not change)
    assert h.noise_std == pytest.approx(2.0 * spec.features.noise_multiplier * h.sensitivity)
    assert spec.dp_event() == RevealedSampledGaussianDpEvent(spec.features.noise_multiplier, 0.1)


def test_budget_exceeded_before_noise(rng: np.random.Generator) -> None:
    src = _zero_source(100, 5, 2)
    terms = SessionTerms(dataset="z", epsilon=4, delta=1e-5, projection="jl", projection_dim=2)
    gen = np.random.default_rng(0)
    rel, ledger = memory_releaser(src, "z", Budget(5, 1e-5), gen)  # the default policy
    disc = TargetDisclosure(Scaling(np.zeros(5), np.ones(5)))
    info = rel.open_session(terms, disc)
    rel.release(info.session_id, 0)
    info2 = rel.open_session(terms, disc)
    before = gen.bit_generator.state
    from dpda.errors import BudgetExceeded

    with pytest.raises(BudgetExceeded):
        rel.release(info2.session_id, 0)
    assert gen.bit_generator.state == before  # no noise drawn
    assert len(ledger.store.entries()) == 1  # nothing written


def test_a_peers_basis_with_huge_entries_is_refused_without_overflow() -> None:
    """A basis of finite but huge entries (1e200): its Gram matrix would overflow; the check
    refuses it as not orthonormal instead (an INTERNAL error before, found by the fuzzer)."""
    import warnings

    from dpda.dp.mechanisms import check_projection

    m = np.full((40, 5), 1e200)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="not orthonormal"):
            check_projection(m, 40, orthonormal=True)
    q, _ = np.linalg.qr(np.random.default_rng(0).normal(size=(40, 5)))
    check_projection(q, 40, orthonormal=True)  # a real orthonormal basis passes


def test_warming_a_charge_charges_draws_prepares_and_writes_nothing() -> None:
    """``SourceReleaser.warm_charge`` (the daemon runs it after OpenSession and after each
    release): the charge composed ahead, with no ledger entry, no noise drawn and no features
    prepared (a session costs no memory before a release) — also when the budget would refuse
    the release, which then refuses with the numbers, as without it."""
    from dpda.errors import BudgetExceeded

    src = _zero_source(100, 5, 2)
    terms = SessionTerms(dataset="z", epsilon=4, delta=1e-5, projection="jl", projection_dim=2)
    gen = np.random.default_rng(0)
    rel, ledger = memory_releaser(src, "z", Budget(5, 1e-5), gen)
    disc = TargetDisclosure(Scaling(np.zeros(5), np.ones(5)))
    info = rel.open_session(terms, disc)
    before = gen.bit_generator.state
    rel.warm_charge(info.session_id, [("peer", 100.0, [])])
    assert gen.bit_generator.state == before and ledger.store.entries() == []
    assert rel._features == {}
    rel.release(info.session_id, 0)
    info2 = rel.open_session(terms, disc)
    rel.warm_charge(info2.session_id)  # over the dataset's cap: no exception, nothing written
    assert len(ledger.store.entries()) == 1
    with pytest.raises(BudgetExceeded, match="cap ε 5"):
        rel.release(info2.session_id, 0)


def test_planning_ahead_charges_draws_prepares_and_stores_nothing() -> None:
    """``SourceReleaser.warm_plan`` (a peer's ``DescribeDataset`` with planned terms): the plan
    and the first charge composed ahead with no session, no entry, no noise and no features —
    also when the budget would refuse the release; terms ``prepare`` refuses raise the same."""
    from dpda.dp.work_bounds import fresh_caches
    from dpda.errors import InvalidInput, PolicyRefused

    src = _zero_source(100, 5, 2)
    terms = SessionTerms(dataset="z", epsilon=3.71, delta=1e-5, projection="jl", projection_dim=2)
    gen = np.random.default_rng(0)
    rel, ledger = memory_releaser(src, "z", Budget(5, 1e-5), gen)
    before = gen.bit_generator.state
    with fresh_caches() as own:
        rel.warm_plan(terms, [("peer", 100.0, [])])
    assert own.epsilon.keys()  # composed ahead
    assert gen.bit_generator.state == before and ledger.store.entries() == []
    assert rel._features == {} and rel._sessions == {}
    rel.warm_plan(terms.model_copy(update={"epsilon": 50.0}))  # over the cap: nothing raised
    with pytest.raises(PolicyRefused, match="delta differs"):
        rel.warm_plan(terms.model_copy(update={"delta": 1e-6}))
    with pytest.raises(InvalidInput, match="projection_dim 40 exceeds"):  # as OpenSession
        rel.warm_plan(terms.model_copy(update={"projection_dim": 40}))
    assert gen.bit_generator.state == before and ledger.store.entries() == []


def test_large_features_go_into_memory_mapped_ahead_with_the_same_values() -> None:
    """Features past ``POPULATE_MIN_BYTES`` are computed into memory the kernel mapped in one
    call (``MAP_POPULATE`` where the platform has it): the same values and dtypes as the plain
    formula, writable until the cache freezes them; small ones are plain ``np.empty``."""
    import mmap

    from dpda.source_party.features import (
        CLAMP,
        POPULATE_MAX_BYTES,
        POPULATE_MIN_BYTES,
        populated_empty,
        scaled_features,
    )

    def root(a: np.ndarray) -> object:
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a.base.obj if isinstance(a.base, memoryview) else a.base

    rng = np.random.default_rng(4)
    rows = np.abs(rng.normal(size=(POPULATE_MIN_BYTES // (8 * 60) + 5, 60)))
    rows[0, 0], rows[1, 1] = np.inf, np.nan
    scaling = Scaling(rng.normal(size=60), rng.uniform(0.5, 2.0, size=60))
    with np.errstate(all="ignore"):
        plain = np.nan_to_num(np.clip((rows - scaling.mean) / scaling.std, -CLAMP, CLAMP))
    got = scaled_features(rows, scaling)
    assert got.dtype == plain.dtype and np.array_equal(got, plain) and got.flags.writeable
    populated = hasattr(mmap, "MAP_POPULATE")
    assert isinstance(root(got), mmap.mmap) == populated
    assert np.array_equal(scaled_features(rows, None), np.nan_to_num(np.clip(rows, -CLAMP, CLAMP)))
    small = populated_empty((4, 4), np.float32)
    assert small.dtype == np.float32 and small.shape == (4, 4) and root(small) is None
    # past the cap: np.empty (mapping it in one call would hold the GIL for all its pages)
    assert root(populated_empty((POPULATE_MAX_BYTES // 8 + 1,), np.float64)) is None


def test_scaled_features_are_the_per_row_map_then_the_scaling_and_clamp() -> None:
    """``scaled_features`` (per-row part computed once per dataset, the target's scaling in
    place per session) equals the plain formula bit for bit, infinities and NaN included, and
    leaves the shared rows untouched."""
    from dpda.data.preprocessing import per_row
    from dpda.source_party.features import CLAMP, prepare_features, scaled_features

    rng = np.random.default_rng(3)
    x = np.abs(rng.normal(size=(40, 6)))
    x[0, 0], x[1, :] = 1e308, 0.0
    scaling = Scaling(rng.normal(size=6), np.array([1e-300, 1.0, 2.0, 0.5, 3.0, 1e300]))
    for rep in ("sqrt", "raw", "l2"):
        with np.errstate(all="ignore"):  # l2: the 1e308 row's norm overflows (as in a daemon)
            rows = per_row(x, rep)
            plain = np.nan_to_num(np.clip((rows - scaling.mean) / scaling.std, -CLAMP, CLAMP))
            from_raw = prepare_features(x, rep, scaling)
        kept = rows.copy()
        got = scaled_features(rows, scaling)
        assert np.array_equal(got, plain) and np.array_equal(rows, kept)
        assert np.array_equal(from_raw, plain)
        unscaled = np.nan_to_num(np.clip(rows, -CLAMP, CLAMP))
        assert np.array_equal(scaled_features(rows, None), unscaled)
    # float32 rows (an in-process caller's own Domain): the same dtypes as Scaling.apply gives
    rows32 = per_row(x[2:].astype(np.float32), "sqrt")
    for sc in (None, scaling, Scaling(scaling.mean.astype(np.float32), np.ones(6, np.float32))):
        with np.errstate(all="ignore"):
            ref = rows32 if sc is None else sc.apply(rows32)
            ref = np.nan_to_num(np.clip(ref, -CLAMP, CLAMP))
        got = scaled_features(rows32, sc)
        assert got.dtype == ref.dtype and np.array_equal(got, ref)
