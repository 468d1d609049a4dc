"""The source's DP standardization (``dpda.dp.preprocessing_dp``): its sensitivities, the noise
drawn against the ledger's claim, hostile values, the policy's say over the share, the plan's
spend, and the target's exact counterpart in its view and saved model."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpda.data.loaders import Domain
from dpda.dp.ledger import Budget, spend_of
from dpda.dp.preprocessing_dp import (
    GRID,
    NORM_GRID,
    column_histograms,
    exact_standardization,
    fit,
    mixed_units,
    norm_histogram,
    plausible_bound,
    preprocessing_spec,
)
from dpda.errors import PolicyRefused
from dpda.planner import plan_batches
from dpda.protocol import BatchRelease, TargetDisclosure
from dpda.terms import SessionTerms
from tests.support import memory_releaser
from tests.unit.noise_checks import std_matches

HOSTILE = [np.nan, np.inf, -np.inf, 1e308, -1e308, 1e-300, -1e-300, 0.0]


def _mixed(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Columns of very different units (0.01 … 1000) carrying a two-class signal."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, n)
    units = np.array([0.01, 0.1, 1.0, 10.0, 100.0, 1000.0])
    x = (5.0 + rng.normal(size=(n, 6)) + 1.5 * y[:, None]) * units
    return x, y


def test_one_replaced_row_moves_the_histograms_by_at_most_their_sensitivity() -> None:
    """Replace-one moves each column's histogram by one count down and one up: L2 √(2d); the
    norms' histogram by √2. Checked on random and hostile replacements."""
    rng = np.random.default_rng(1)
    x, _ = _mixed(50)
    spec = preprocessing_spec(1.0, x.shape[1], "replace-one", 0.1)
    assert spec.columns_sensitivity == pytest.approx(math.sqrt(12))
    assert spec.norms_sensitivity == pytest.approx(math.sqrt(2))
    assert preprocessing_spec(1.0, 6, "add-remove", 0.1).columns_sensitivity == pytest.approx(
        math.sqrt(6)
    )
    h = column_histograms(x)
    worst = 0.0
    for _ in range(200):
        x2 = x.copy()
        x2[rng.integers(50)] = rng.choice(HOSTILE + [1e6, -3.0], size=6)
        worst = max(worst, float(np.linalg.norm(column_histograms(x2) - h)))
        n1 = norm_histogram(x).astype(float)
        assert np.linalg.norm(norm_histogram(x2) - n1) <= math.sqrt(2) + 1e-12
    assert worst <= spec.columns_sensitivity + 1e-12
    assert worst == pytest.approx(spec.columns_sensitivity)  # reached: not a loose bound
    assert h.sum() == 50 * 6 and h.shape == (6, GRID.size + 1)


def test_hostile_values_change_nothing_but_their_own_row() -> None:
    """NaN, ±inf, ±1e308 and ±1e-300 in a row: the row is made finite (a non-finite row is the
    zero row) and counted once per column; every statistic comes out finite and positive."""
    x, _ = _mixed(200)
    x[:8] = np.array(HOSTILE)[:, None] * np.ones((1, 6))
    spec = preprocessing_spec(2.0, 6, "replace-one", 0.1)
    st = fit(x, spec, np.random.default_rng(0))
    assert np.all(np.isfinite(st.loc)) and np.all(np.isfinite(st.scale))
    assert np.all(st.scale > 0) and math.isfinite(st.clip_norm) and st.clip_norm > 0
    z = st.apply(x)
    assert np.all(np.isfinite(z)) and np.all(np.linalg.norm(z, axis=1) <= 1 + 1e-12)
    assert column_histograms(x).sum() == x.size


def _session(x: np.ndarray, y: np.ndarray, **kw: object):
    rel, ledger = memory_releaser(
        Domain("d", x, y, 2), "d", Budget(100, 1e-4), np.random.default_rng(4)
    )
    terms = SessionTerms(dataset="d", epsilon=8.0, delta=1e-4, preprocessing="standardize", **kw)
    info = rel.open_session(terms, TargetDisclosure(None, None))
    return rel, ledger, terms, info


def test_the_ledger_charges_it_once_with_the_first_release_and_the_session_spends_epsilon() -> None:
    from dpda.dp.events import event_to_json

    x, y = _mixed()
    rel, ledger, terms, info = _session(x, y)
    first = rel.release(info.session_id, 0)
    entries = ledger.store.entries("d")
    # one entry: the preprocessing composed with the first release, as every release is signed
    assert [e.request_id.split("/")[1] for e in entries] == ["0"]
    pre = info.plan.preprocessing_spec(terms)
    assert pre is not None and entries[0].params["preprocessing"] == pre.to_json()
    assert entries[0].dp_event == event_to_json(info.plan.charged_event(terms, 0))
    assert len(info.plan.charged_events(terms, 0)) == 2
    assert len(info.plan.charged_events(terms, 1)) == 1
    # the payload digest covers the statistics the release carries
    assert first.standardization is not None
    assert entries[0].payload_sha256 == first.sha256()
    bare = BatchRelease(first.index, first.z, first.noisy_counts, first.spec, first.ledger_seq)
    assert bare.sha256() != first.sha256()
    spent = ledger.spent("d")
    assert 0.99 * terms.epsilon <= spent <= terms.epsilon
    assert spent == pytest.approx(spend_of(info.plan.events(terms), terms.delta), abs=1e-9)
    report = rel.preprocessing_reports[info.session_id]
    assert report["share"] == terms.preprocessing_share and report["rows_clipped_estimate"] >= 0
    # the columns' units are learned: the scales follow the units (0.01 … 1000)
    st = rel._standardized[info.session_id][0]
    ratio = st.scale / np.array([0.01, 0.1, 1.0, 10.0, 100.0, 1000.0])
    assert np.all((ratio > 0.2) & (ratio < 5))


def test_the_noise_drawn_is_the_ledgers_claim(monkeypatch: pytest.MonkeyPatch) -> None:
    """The histograms' noise, captured where it is drawn, has the std the entry's spec says."""
    import dpda.dp.preprocessing_dp as pp

    drawn: list[tuple[np.ndarray, float]] = []
    real = pp.gaussian_noise

    def spy(shape, std, rng):
        out = real(shape, std, rng)
        drawn.append((out, std))
        return out

    monkeypatch.setattr(pp, "gaussian_noise", spy)
    x, y = _mixed(400)
    rel, ledger, terms, info = _session(x, y)
    rel.release(info.session_id, 0)
    claim = ledger.store.entries("d")[0].params["preprocessing"]
    spec = pp.PreprocessingSpec(**claim)
    (_, s_c), (_, s_n) = drawn
    assert s_c == pytest.approx(spec.columns_noise_std)
    assert s_n == pytest.approx(spec.norms_noise_std)
    assert s_c == pytest.approx(claim["columns_noise_multiplier"] * math.sqrt(2 * 6))
    assert s_n == pytest.approx(claim["norms_noise_multiplier"] * math.sqrt(2))
    # the same draws, repeated with the claimed spec, have the claimed spread
    drawn.clear()
    rng = np.random.default_rng(9)
    for _ in range(100):
        pp.fit(x, spec, rng)
    cols = np.concatenate([d.ravel() for d, s in drawn if s == s_c])
    norms = np.concatenate([d.ravel() for d, s in drawn if s == s_n])
    assert std_matches(cols, s_c) and not std_matches(cols, 0.7 * s_c)
    assert not std_matches(cols, 1.3 * s_c)
    assert std_matches(norms, s_n) and not std_matches(norms, 0.7 * s_n)


def test_a_peer_cannot_move_the_share_past_the_policy() -> None:
    """The terms only ask: a share outside the policy's range is refused before anything is
    charged; inside it, whatever the share, the ledger charges what the noise is."""
    x, y = _mixed()
    with pytest.raises(PolicyRefused, match="preprocessing_share"):
        _session(x, y, preprocessing_share=0.9)
    rel, ledger, terms, info = _session(x, y, preprocessing_share=0.3)
    rel.release(info.session_id, 0)
    assert ledger.spent("d") <= terms.epsilon
    assert ledger.store.entries("d")[0].params["preprocessing"]["share"] == 0.3


def test_the_grid_is_public_and_fixed() -> None:
    """The grids are constants of the mechanism (no peer sends them): symmetric, increasing."""
    assert np.all(np.diff(GRID) > 0) and np.allclose(GRID, -GRID[::-1])
    assert np.all(np.diff(NORM_GRID) > 0) and NORM_GRID[0] > 0
    assert "grid" not in SessionTerms.model_fields and "preprocessing_grid" not in (
        SessionTerms.model_fields
    )


def test_the_plan_spends_epsilon_with_the_share_inside_it() -> None:
    for eps in (2.0, 8.0):
        terms = SessionTerms(dataset="d", epsilon=eps, delta=1e-4, preprocessing="standardize")
        plan = plan_batches(terms, 500, np.eye(30))
        spent = spend_of(plan.events(terms), 1e-4)
        assert 0.99 * eps <= spent <= eps
        alone = spend_of([plan.preprocessing_spec(terms).dp_event()], 1e-4)  # type: ignore[union-attr]
        assert alone == pytest.approx(terms.preprocessing_share * eps, rel=1e-3)


def test_the_target_standardizes_its_own_rows_and_the_saved_model_does_too() -> None:
    """A raw source-space job standardizes by default: the target's view, its OT space and the
    saved model on raw rows all use its own exact statistics (its rows in the unit ball)."""
    from dpda.target_party.training import model_pipeline
    from dpda.target_party.view import AdaptConfig, session_terms, target_view

    x, y = _mixed(120, seed=3)
    base = SessionTerms(dataset="d", epsilon=8.0, delta=1e-4)
    view = target_view(Domain("t", x, y, 2), "raw", terms=base)
    asked, _ = session_terms(view, base, AdaptConfig())
    assert asked.preprocessing == "standardize" and asked.clip_norm == 1.0
    assert view.standardization is not None
    st = exact_standardization(x)
    assert np.allclose(view.standardization.loc, st.loc)
    assert np.all(np.linalg.norm(view.rows(), axis=1) <= 1 + 1e-9)
    from sklearn.neighbors import KNeighborsClassifier

    clf = KNeighborsClassifier(1).fit(view.x, y)
    model = model_pipeline("raw", view.scaling, clf, view.clip_norm, view.standardization)
    assert np.array_equal(model.predict(x), clf.predict(view.x))
    sqrt_view = target_view(Domain("t", np.abs(x), y, 2), "sqrt", terms=base)
    assert sqrt_view.standardization is None  # rows with a natural bound: none by default


def test_the_release_brings_the_source_statistics_and_the_model_applies_them() -> None:
    """The source's DP statistics come with the release; the job moves the target's rows into
    that space (its view, OT space and saved model), and the saved model on raw rows predicts
    what its classifier predicts on the job's view of them."""
    from dpda.simulation import simulate
    from dpda.target_party.training import model_pipeline
    from dpda.target_party.view import AdaptConfig

    x, y = _mixed(300, seed=5)
    xt, yt = _mixed(200, seed=6)
    s, t = Domain("d", x, y, 2), Domain("t", xt * 1.5, yt, 2)
    terms = SessionTerms(dataset="d", epsilon=8.0, delta=1e-4)
    out = simulate(s, t, terms, "raw", AdaptConfig(seed=0), 0, baselines=False)
    res = out.dpda
    assert out.to_json(terms)["preprocessing"]["mode"] == "standardize"
    assert res.view is not None and res.view.standardization is not None
    assert res.view.standardization.clip_norm == out.preprocessing["clip_norm"]
    v = res.view
    model = model_pipeline("raw", v.scaling, res.model, v.clip_norm, v.standardization)
    assert np.array_equal(model.predict(xt * 1.5), res.model.predict(v.x))  # type: ignore[attr-defined]
    own = exact_standardization(xt * 1.5)
    assert not np.allclose(v.standardization.loc, own.loc)  # the source's, not the target's


def test_a_table_with_a_few_columns_in_other_units_keeps_per_column_scales() -> None:
    # wine's shape: most columns between 1 and 20, one near 100 and one near 750; the quartile
    # columns spread by 10 only, but the deciles by more than SPREAD_RULE
    wine_like = np.array([0.4, 1.0, 1.6, 2.0, 2.3, 2.3, 2.4, 2.6, 5.0, 13.0, 19.0, 100.0, 750.0])
    assert mixed_units(wine_like)
    # one unit: pixels or measurements in centimetres, within a factor of a few
    assert not mixed_units(np.array([1.3, 3.0, 4.3, 5.8]))
    assert not mixed_units(np.linspace(0.2, 1.0, 100))


def test_a_bound_read_where_no_standardized_row_lies_gives_way_to_the_public_rule(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import dpda.dp.preprocessing_dp as pre

    d = 16
    assert plausible_bound(4.0, d) and plausible_bound(1.0, d) and plausible_bound(16.0, d)
    assert not plausible_bound(0.99, d) and not plausible_bound(16.01, d)
    x = np.random.default_rng(3).normal(size=(4000, d))
    spec = preprocessing_spec(1e-6, d, "replace-one", 0.1)  # noise negligible
    honest = fit(x, spec, np.random.default_rng(4))
    assert plausible_bound(honest.clip_norm, d) and honest.clipped_rows >= 0
    for far in (2.0**-6, 1e4):  # what a lone count of noise past the threshold reads
        monkeypatch.setattr(pre, "read_norms", lambda h, s, c=far: (c, 0.0, 4000.0))
        st = fit(x, spec, np.random.default_rng(4))
        assert st.clip_norm == math.sqrt(d) and math.isnan(st.clipped_rows)
        assert np.array_equal(st.loc, honest.loc)  # the columns' statistics stand


def test_standardizing_by_row_blocks_gives_the_whole_table_rows(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dpda.data import preprocessing as P
    from dpda.dp.mechanisms import clip_rows
    from dpda.dp.preprocessing_dp import Standardization

    rng = np.random.default_rng(3)
    x = rng.normal(size=(41, 5)) * np.array([1.0, 10.0, 100.0, 0.1, 3.0]) + 7.0
    x[4, 2] = np.nan  # a non-finite row is the zero row, in its block as in the table
    x[9] *= 1e300  # a row far past C is clipped without overflow
    st = Standardization(np.full(5, 7.0), np.array([1.0, 10.0, 100.0, 0.1, 3.0]), 2.5, 0.0, 0.0)
    with np.errstate(over="ignore"):
        want = clip_rows(st.standardized(x), 2.5) / 2.5
    monkeypatch.setattr(P, "ROW_BLOCK", 6)  # several blocks, the last one short
    got = st.apply(x)
    np.testing.assert_array_equal(got, want)
    assert np.all(np.linalg.norm(got, axis=1) <= 1 + 1e-12)
    np.testing.assert_array_equal(got[4], st.apply(np.zeros((1, 5)))[0])


def test_a_lone_bin_of_noise_never_sets_the_scale_of_every_column() -> None:
    """The example deployment's source (600 rows, 40 columns in one unit) at the noise of the
    default job's share of ε = 8: over 400 draws no DP scale is 3× the exact one. With the
    pooled counts read at 3 noise stds, 2.6% of draws put a far bin of noise past the 99%
    quantile and read scales up to 10¹⁰ (every row then standardized to nearly 0)."""
    from dpda.data.synthetic import two_domains
    from dpda.dp.preprocessing_dp import PreprocessingSpec

    x = two_domains(600, 500)[0].x
    spec = PreprocessingSpec(4.156, 8.313, x.shape[1], "replace-one", 0.1)
    exact = float(np.median(exact_standardization(x).scale))
    scales = np.array([np.median(fit(x, spec, np.random.default_rng(s)).scale) for s in range(400)])
    assert np.all(scales < 3 * exact), np.sort(scales)[-5:]
