"""The learned ground cost (seed 003, ``dpda.dp.metric``): the pair graph's cap, the sensitivity
of the clipped gradient sum, the noise drawn against the ledger, the ε split, hostile terms and
the target's cost in W's space."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import dp_event
from pydantic import ValidationError

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling
from dpda.dp import metric as M
from dpda.dp.events import MetricSpec, event_from_json
from dpda.dp.ledger import Budget, spend_of
from dpda.dp.mechanisms import clip_rows, gaussian_noise
from dpda.errors import PolicyRefused
from dpda.ot.costs import sq_euclidean
from dpda.planner import plan_batches
from dpda.policy import PrivacyPolicy
from dpda.protocol import TargetDisclosure
from dpda.terms import SessionTerms, metric_params
from tests.support import memory_releaser
from tests.unit.noise_checks import std_matches


def _terms(**kw: object) -> SessionTerms:
    base: dict[str, object] = {
        "dataset": "d",
        "epsilon": 4.0,
        "delta": 1e-5,
        "projection_dim": 6,
        "clip_norm": 1.0,
        "cost": "metric",
    }
    return SessionTerms.model_validate({**base, **kw})


def _data(n: int = 400, q: int = 3, k: int = 8, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % q
    x = rng.normal(size=(n, k)) * 0.3 + np.eye(q, k)[y]
    return x, y


def _releaser(x, y, q, budget=100.0, **kw):
    kw.setdefault("policy", PrivacyPolicy(allow_metric=True))  # the source's opt-in
    return memory_releaser(
        Domain("d", x, y, q), "d", Budget(budget, 1e-5), np.random.default_rng(3), **kw
    )


def _disclosure(k: int, ell: int) -> TargetDisclosure:
    return TargetDisclosure(Scaling(np.zeros(k), np.ones(k)), np.eye(k)[:, :ell])


@pytest.mark.parametrize("n,m", [(2, 1), (7, 3), (50, 4), (101, 5), (400, 8)])
def test_the_pair_graph_caps_pairs_per_record_and_reads_indices_only(n: int, m: int) -> None:
    pairs = M.pair_graph(n, m)
    degree = np.bincount(pairs.ravel(), minlength=n)
    assert degree.max() <= m
    assert np.all(pairs[:, 0] != pairs[:, 1])
    assert np.array_equal(pairs, M.pair_graph(n, m))  # public: n and m decide it
    if n >= 50:  # almost every record reaches the cap (fixed points are rare)
        assert np.mean(degree == m) > 0.8


def test_one_record_moves_the_clipped_sum_by_at_most_2mG_and_nearly_attains_it() -> None:
    """Replace one record in the maximum number of pairs (features and label): the clipped
    gradient sum moves by ≤ 2mG in Frobenius norm, for any W; a worst case comes close."""
    rng = np.random.default_rng(1)
    n, ell, m, g = 60, 5, 6, 0.5
    pairs = M.pair_graph(n, m)
    degree = np.bincount(pairs.ravel(), minlength=n)
    i = int(np.argmax(degree))
    assert degree[i] == m
    bound = M.replace_one_sensitivity(m, g)
    worst = 0.0
    for trial in range(200):
        u = clip_rows(rng.normal(size=(n, ell)) * rng.uniform(0.1, 3), 1.0)
        y = rng.integers(0, 2, n)
        w = rng.normal(size=(3, ell)) * rng.uniform(0.1, 5)
        u2, y2 = u.copy(), y.copy()
        u2[i] = clip_rows(rng.normal(size=(1, ell)) * 5, 1.0)[0]
        y2[i] = rng.integers(0, 2)
        if trial == 0:  # a crafted worst case: every partner of i identical to i and similar,
            # the replacement far away and dissimilar (outside every partner's margin: 0)
            partners = np.concatenate([pairs[pairs[:, 0] == i, 1], pairs[pairs[:, 1] == i, 0]])
            u[partners] = u[i] = np.eye(ell)[0]
            y[partners] = y[i] = 0
            u2, y2 = u.copy(), y.copy()
            u2[i], y2[i] = -np.eye(ell)[0], 0
            w = np.eye(3, ell) * 10
        s1 = M.clipped_gradient_sum(w, u, pairs, y[pairs[:, 0]] == y[pairs[:, 1]], 1.0, g)
        s2 = M.clipped_gradient_sum(w, u2, pairs, y2[pairs[:, 0]] == y2[pairs[:, 1]], 1.0, g)
        moved = float(np.linalg.norm(s1 - s2))
        assert moved <= bound * (1 + 1e-9)
        worst = max(worst, moved)
    # similar pairs at distance 0 → all similar at distance 2 (clipped to G): m·G from the
    # changed terms; the bound 2mG needs a gradient that flips direction, so ≥ half of it
    assert worst >= 0.5 * bound


def test_the_clipped_sum_equals_the_per_pair_definition() -> None:
    rng = np.random.default_rng(2)
    u = clip_rows(rng.normal(size=(30, 4)), 1.0)
    y = rng.integers(0, 2, 30)
    w = rng.normal(size=(2, 4))
    pairs = M.pair_graph(30, 3)
    sim = y[pairs[:, 0]] == y[pairs[:, 1]]
    ref = np.zeros_like(w)
    for (a, b), s in zip(pairs, sim, strict=True):
        d = u[a] - u[b]
        dist = np.linalg.norm(w @ d)
        if s:
            grad = 2 * np.outer(w @ d, d)
        elif dist < 0.8:
            grad = -2 * (0.8 - dist) / dist * np.outer(w @ d, d)
        else:
            grad = np.zeros_like(w)
        norm = np.linalg.norm(grad)
        ref += grad * min(1.0, 0.3 / norm) if norm > 0 else grad
    got = M.clipped_gradient_sum(w, u, pairs, sim, 0.8, 0.3)
    assert np.allclose(got, ref)


def test_noise_matches_the_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the data fixed, each of the T steps draws Gaussian noise of exactly σ·2mG (the
    ledger's spec) on the d′ × ℓ gradient sum; the samples have that std and a 30%-less-noise
    sampler fails the same check. The ledger charged SelfComposed(Gaussian(σ), T)."""
    drawn: list[tuple[float, np.ndarray]] = []

    def recording(shape, std, rng):
        out = gaussian_noise(shape, std, rng)
        drawn.append((std, out))
        return out

    monkeypatch.setattr(M, "gaussian_noise", recording)
    x, y = _data(k=24)
    terms = _terms(
        projection_dim=20, metric_steps=30, metric_pairs=3, metric_clip=0.25, metric_dim=20
    )
    rel, ledger = _releaser(x, y, 3)
    info = rel.open_session(terms, _disclosure(24, 20))
    assert info.plan.releases == 2 and info.plan.is_metric(1)
    out = rel.release(info.session_id, 1)
    entry = ledger.store.entries("d")[-1]
    spec = entry.params["spec"]
    assert spec["kind"] == "metric" and spec["steps"] == 30
    assert spec["sensitivity"] == pytest.approx(2 * 3 * 0.25)
    claimed = spec["noise_multiplier"] * spec["sensitivity"]
    assert len(drawn) == 30 and all(std == pytest.approx(claimed) for std, _ in drawn)
    samples = np.concatenate([d.ravel() for _, d in drawn])
    assert samples.size == 30 * 20 * 20
    assert std_matches(samples, claimed)
    assert not std_matches(samples, 0.7 * claimed)
    assert out.z.shape == (20, 20) and out.noisy_counts.shape == (0,)
    assert event_from_json(entry.dp_event) == dp_event.SelfComposedDpEvent(
        dp_event.GaussianDpEvent(spec["noise_multiplier"]), 30
    )


def test_the_metric_split_keeps_the_session_within_epsilon() -> None:
    """The features and the metric compose to exactly the Gaussian the features alone had:
    the session's spend with the metric equals the spend without it (to rounding), ≤ ε."""
    x, _ = _data()
    m = np.eye(8)[:, :6]
    for release in ("prototypes", "sinkhorn-synthetic"):
        base = _terms(cost="sqeuclidean", release=release)
        with_metric = _terms(release=release, metric_share=0.3)
        p0 = plan_batches(base, 400, m)
        p1 = plan_batches(with_metric, 400, m)
        e0 = spend_of(p0.events(base), 1e-5)
        e1 = spend_of(p1.events(with_metric), 1e-5)
        assert e1 == pytest.approx(e0, rel=1e-6) and e1 <= with_metric.epsilon
        spec = p1.metric_spec(with_metric)
        assert isinstance(spec, MetricSpec)
        # the metric's share of μ²: T / σ_m² = s / σ², with σ the features' joint σ
        mu2_f = p1.feature_gradient_steps / p1.feature_noise_multiplier**2
        mu2_m = spec.steps / spec.noise_multiplier**2
        assert mu2_m / (mu2_f + mu2_m) == pytest.approx(0.3, rel=1e-9)
    attr = _terms(privacy_unit="attribute", release="rows")
    p = plan_batches(attr, 400, m, attribute_bound=0.1)
    assert spend_of(p.events(attr), 1e-5) <= attr.epsilon


@pytest.mark.parametrize(
    "field,value",
    [
        ("metric_share", 0.0),
        ("metric_share", 1.0),
        ("metric_share", float("nan")),
        ("metric_pairs", 0),
        ("metric_pairs", 10**9),
        ("metric_clip", 1e-300),
        ("metric_clip", 1e308),
        ("metric_margin", float("inf")),
        ("metric_steps", 0),
        ("metric_steps", 10**6),
        ("metric_learning_rate", 1e308),
        ("metric_dim", 7),  # more than projection_dim
    ],
)
def test_hostile_terms_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        _terms(**{field: value})


def test_the_metric_is_not_combined_with_minibatches() -> None:
    with pytest.raises(ValidationError, match="cost: a metric cost is offered with whole"):
        _terms(privacy_unit="attribute", release="rows", batch_size=64)


@pytest.mark.slow
def test_refusals_charge_nothing() -> None:
    """A policy without the metric, a release past the work bound and a metric below the noise
    floor are refused when the session opens: nothing is charged or drawn."""
    x, y = _data()
    d = _disclosure(8, 6)
    rel, ledger = _releaser(x, y, 3, policy=PrivacyPolicy(allow_metric=False))
    with pytest.raises(PolicyRefused, match="learned metric"):
        rel.open_session(_terms(), d)
    terms = _terms(metric_steps=1000, metric_pairs=64)
    rel, ledger = _releaser(x, y, 3, policy=PrivacyPolicy(allow_metric=True, max_metric_work=1e6))
    with pytest.raises(PolicyRefused, match="more work"):
        rel.open_session(terms, d)
    rel, ledger = _releaser(
        x, y, 3, policy=PrivacyPolicy(allow_metric=True, min_noise_multiplier=5.0)
    )
    with pytest.raises(PolicyRefused, match="noise multiplier"):
        rel.open_session(_terms(epsilon=100.0, metric_share=0.99, metric_steps=1), d)
    assert ledger.store.entries("d") == []


def test_without_cost_nothing_changes() -> None:
    x, _ = _data()
    t = _terms(cost="sqeuclidean")
    plan = plan_batches(t, 400, np.eye(8)[:, :6])
    assert plan.releases == plan.steps and plan.metric_spec(t) is None


def test_the_metric_separates_classes_without_noise() -> None:
    """Non-private descent on the contrastive loss lowers it and puts same-class rows closer
    than other-class rows in W's space than in the original one."""
    x, y = _data(n=300, k=6)
    z = clip_rows(x, 1.0)
    p = metric_params(_terms(metric_steps=60, metric_learning_rate=2.0, metric_clip=2.0))
    trace: list[float] = []
    w = M.train_metric(z, y, p, 1.0, 0.0, np.random.default_rng(0), trace=trace)
    assert trace[-1] < trace[0]

    def ratio(a: np.ndarray) -> float:
        d = sq_euclidean(a, a)
        same = y[:, None] == y[None, :]
        return float(d[same].mean() / d[~same].mean())

    assert ratio(z @ w.T) < ratio(z)


def test_the_target_transports_in_ws_space() -> None:
    """cost = metric: the cost is ‖W(z_s − z_t)‖²; a W that zeroes a noise direction makes the
    plan ignore it."""
    from dpda.target_party.fitting import fit_points
    from dpda.target_party.view import AdaptConfig, TargetView

    rng = np.random.default_rng(0)
    xt = np.vstack(
        [
            np.c_[np.zeros(20), rng.normal(size=20) * 5],
            np.c_[np.ones(20) * 3, rng.normal(size=20) * 5],
        ]
    )
    pts = np.array([[0.0, 5.0], [3.0, -5.0]])
    ys = np.array([0, 1])
    view = TargetView(xt, Scaling(np.zeros(2), np.ones(2)), None, -np.ones(40, dtype=np.int64))
    cfg = AdaptConfig(seed=0, reg_g=0.0)
    w = np.array([[1.0, 0.0]])
    fit = fit_points(pts, ys, np.full(2, 0.5), 0.0, xt, view, cfg, 2, metric=w)
    # class 0 goes to the first cluster (x = 0), class 1 to the second (x = 3)
    assert fit.class_mass[0, :20].sum() > 0.95 * fit.class_mass[0].sum()
    assert fit.class_mass[1, 20:].sum() > 0.95 * fit.class_mass[1].sum()


@pytest.mark.slow
@pytest.mark.data
def test_simulate_cost_metric_contract(data_dir, tmp_path) -> None:
    """``dpda simulate … --cost metric --json OUT``: the same keys as without ``--cost``, and
    ``epsilon_spent`` is the ledger's spend with the metric's charge in it (≤ ε)."""
    import json

    from dpda.cli.main import main

    def run(extra: list[str], name: str) -> dict:
        out = tmp_path / name
        argv = ["simulate", "--data-dir", str(data_dir), "--dataset", "office-caltech"]
        argv += ["--source", "D", "--target", "W", "--seed", "0", "--json", str(out), *extra]
        assert main(argv) == 0
        return json.loads(out.read_text())

    plain, metric = run([], "plain.json"), run(["--cost", "metric"], "metric.json")
    assert set(plain) == set(metric)
    assert 0 < metric["epsilon_spent"] <= 8.0
    # the split keeps the composed Gaussian: each spends its ε to rounding toward more noise
    # (the default source-space release is calibrated at √2·C, within 0.1% of ε)
    assert metric["epsilon_spent"] == pytest.approx(8.0, rel=1e-6)
    assert 0.99 * 8.0 <= plain["epsilon_spent"] <= 8.0
    assert metric["accuracy"]["dpda"] != plain["accuracy"]["dpda"]  # the cost did change


def test_a_lowered_projection_dim_lowers_metric_dim_too() -> None:
    """The target lowers ℓ to what its data allows; d′ follows, so the terms stay valid."""
    from dpda.target_party.view import AdaptConfig, session_terms, target_view

    rng = np.random.default_rng(0)
    t = Domain("t", rng.normal(size=(30, 8)), np.arange(30) % 2, 2)
    terms = _terms(projection_dim=20, metric_dim=15)
    got, basis = session_terms(target_view(t, "raw"), terms, AdaptConfig())
    assert got.projection_dim == 8 and got.metric_dim == 8 and basis is not None
    SessionTerms.model_validate(got.model_dump())  # what the source will check


def test_a_budget_too_small_for_any_useful_metric_is_refused_before_the_charge() -> None:
    """ε = 1e-300 asks for noise past any float's reach over T steps: refused at the plan
    (the session never opens), nothing charged — by the metric's noise ceiling (theorem2), or
    under the default exact calibration already by the counts' floor; a small but sane ε gives
    finite W."""
    x, y = _data()
    d = _disclosure(8, 6)
    rel, ledger = _releaser(x, y, 3)
    hostile = {"epsilon": 1e-300, "metric_share": 0.01, "metric_pairs": 64, "metric_clip": 1e3}
    with pytest.raises(PolicyRefused, match="epsilon: the metric's noise"):
        rel.open_session(_terms(**hostile, calibration="theorem2"), d)
    with pytest.raises(PolicyRefused, match="discrete-Laplace parameter .* below the floor"):
        rel.open_session(_terms(**hostile), d)
    assert ledger.store.entries("d") == []
    t = _terms(
        epsilon=0.01,
        metric_share=0.01,
        metric_steps=1000,
        metric_learning_rate=100,
        histogram_share=0.5,  # counts above the sampler's floor at this ε (0.1 is not)
    )
    info = rel.open_session(t, d)
    w = rel.release(info.session_id, info.plan.steps).z
    assert np.all(np.isfinite(w))


def test_each_clipped_pair_term_stays_within_the_clip_near_the_null_space_of_w() -> None:
    """A dissimilar pair with WΔ ≈ 0 but Δ not small has a huge coefficient; the term is built
    from the same WΔ whose norm was clipped, so rounding cannot carry it past G."""
    rng = np.random.default_rng(0)
    w = np.array([[1.0, -1.0, 0.0]])
    worst = 0.0
    for _ in range(2000):
        a = rng.normal(size=3)
        b = a - rng.normal() * np.array([1.0, 1.0, 0.0]) * (1 + 1e-15 * rng.normal())
        u = np.stack([a, b])
        g = M.clipped_gradient_sum(w, u, np.array([[0, 1]]), np.array([False]), 10.0, 1e-3)
        worst = max(worst, float(np.linalg.norm(g)) / 1e-3)
    assert worst <= 1.0 + 1e-9


def test_the_pair_graph_is_laid_on_a_secret_shuffle_not_the_stored_order() -> None:
    """Rows stored sorted by class: replacing one record with another class moves every row
    between the classes; the pairs are drawn on positions of a secret uniform shuffle, so two
    noise-free trainings with different streams pair the same rows differently (with no shuffle
    they would be identical)."""
    rng = np.random.default_rng(5)
    z = rng.normal(size=(60, 3)) * 0.3
    y = np.sort(rng.integers(0, 3, 60))
    params = M.MetricParams(dim=2, pairs_per_record=2, margin=1.0, metric_clip=1.0, steps=3,
                            learning_rate=1.0)  # fmt: skip
    a = M.train_metric(z, y, params, 1.0, 0.0, np.random.default_rng(1))
    b = M.train_metric(z, y, params, 1.0, 0.0, np.random.default_rng(2))
    assert not np.allclose(a, b)
    same = M.train_metric(z, y, params, 1.0, 0.0, np.random.default_rng(1))
    assert np.array_equal(a, same)


def test_a_metric_that_needs_more_memory_than_the_policy_allows_is_refused_uncharged() -> None:
    x, y = np.random.default_rng(0).normal(size=(200, 6)), np.arange(200) % 3
    rel, ledger = _releaser(x, y, 3, policy=PrivacyPolicy(allow_metric=True, max_metric_bytes=1e5))
    terms = SessionTerms(dataset="d", epsilon=4.0, delta=1e-5, projection_dim=4, cost="metric",
                         metric_dim=2, metric_pairs=8)  # fmt: skip
    with pytest.raises(PolicyRefused, match="MiB"):
        rel.open_session(terms, _disclosure(6, 4))
    assert ledger.store.entries("d") == []


def test_the_mechanism_records_name_the_clip_and_the_points_as_the_terms_do() -> None:
    """One name per concept: the records' fields that are terms carry the terms' names."""
    from dataclasses import fields

    from dpda.dp.sinkhorn_synthetic import SinkhornSyntheticParams
    from dpda.terms import synthetic_params

    terms = _terms(metric_clip=2.5, synthetic_points=7)
    assert metric_params(terms).metric_clip == 2.5
    assert synthetic_params(terms).synthetic_points == 7
    names = {f.name for f in fields(M.MetricParams)} | {
        f.name for f in fields(SinkhornSyntheticParams)
    }
    assert not names & {"gradient_clip", "points_per_class"}
