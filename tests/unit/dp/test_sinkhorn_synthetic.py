"""sinkhorn-synthetic (seed 002): the noise drawn against the ledger, the sensitivity on the whole
gradient vector, the peer's extreme terms, and the target's view of the points."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import dp_event
from pydantic import ValidationError

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling
from dpda.dp import sinkhorn_synthetic as S
from dpda.dp.accounting import epsilon_of
from dpda.dp.events import event_from_json
from dpda.dp.ledger import Budget
from dpda.dp.mechanisms import clip_rows, gaussian_noise
from dpda.planner import plan_batches
from dpda.protocol import TargetDisclosure
from dpda.target_party.fitting import aggregate_points
from dpda.terms import SessionTerms
from tests.support import memory_releaser
from tests.unit.noise_checks import std_matches


def _terms(**kw: object) -> SessionTerms:
    base: dict[str, object] = {
        "dataset": "d",
        "epsilon": 4.0,
        "delta": 1e-5,
        "projection_dim": 10,
        "release": "sinkhorn-synthetic",
        "clip_norm": 1.0,
    }
    return SessionTerms.model_validate({**base, **kw})


def _release(x: np.ndarray, y: np.ndarray, q: int, terms: SessionTerms):
    k = x.shape[1]
    rel, ledger = memory_releaser(
        Domain("d", x, y, q), "d", Budget(100, 1e-5), np.random.default_rng(3)
    )
    basis = np.eye(k)[:, : terms.projection_dim]
    info = rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(k), np.ones(k)), basis))
    return rel.release(info.session_id, 0), ledger.store.entries("d")[-1]


def _data(n: int = 600, q: int = 4, k: int = 12, seed: int = 0):
    rng = np.random.default_rng(seed)
    y = np.arange(n) % q
    x = rng.normal(size=(n, k)) + 2.0 * np.eye(q, k)[y]
    return x, y


@pytest.mark.slow
def test_noise_matches_the_ledger(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step draws Gaussian noise of exactly the spec's std (σ·2) on the whole stacked
    gradient vector, T times, and the ledger charged SelfComposed(Gaussian(σ), T) with the
    histogram; the samples have that std, and a 30%-less-noise sampler fails the same check."""
    drawn: list[tuple[float, np.ndarray]] = []

    def recording(shape, std, rng):  # the sampler the release really calls, recorded
        out = gaussian_noise(shape, std, rng)
        drawn.append((std, out))
        return out

    monkeypatch.setattr(S, "gaussian_noise", recording)
    x, y = _data(q=40)
    terms = _terms(synthetic_points=25, synthetic_rows_per_point=1, sinkhorn_steps=6)
    rel, entry = _release(x, y, 40, terms)
    f = entry.params["spec"]["features"]
    assert f["sensitivity"] == pytest.approx(2.0) and f["steps"] == 6
    claimed = f["noise_multiplier"] * f["sensitivity"]
    assert len(drawn) == 6 and all(std == pytest.approx(claimed) for std, _ in drawn)
    samples = np.concatenate([d.ravel() for _, d in drawn])
    sizes = S.points_per_class(rel.noisy_counts, 25, 1)  # one per noisy row, at most 25
    assert samples.size == 6 * sizes.sum() * (10 + 1)  # every coordinate of every class block
    assert std_matches(samples, claimed)
    assert not std_matches(samples, claimed * 0.7)
    # the charge: T Gaussians of σ, which is exactly one Gaussian of σ/√T, with the counts
    event = event_from_json(entry.dp_event)
    assert isinstance(event, dp_event.ComposedDpEvent)
    steps, hist = event.events
    assert steps == dp_event.SelfComposedDpEvent(dp_event.GaussianDpEvent(f["noise_multiplier"]), 6)
    merged = dp_event.ComposedDpEvent(
        [dp_event.GaussianDpEvent(f["noise_multiplier"] / np.sqrt(6)), hist]
    )
    assert epsilon_of([event], 1e-5) == pytest.approx(epsilon_of([merged], 1e-5), rel=1e-6)
    assert epsilon_of([event], 1e-5) <= terms.epsilon
    assert rel.z.shape == (sizes.sum(), 10)

    # a weakened variant of the mechanism (30% less noise) is caught by the same check
    weak: list[np.ndarray] = []

    def weaker(shape, std, rng):
        out = gaussian_noise(shape, 0.7 * std, rng)
        weak.append(out)
        return out

    z = np.vstack([x[:, :10]])
    S.train_synthetic(
        clip_rows(z, 1.0),
        y,
        np.bincount(y),
        S.SinkhornSyntheticParams(25, 6, 0.05, 0.4, 0.5, 1.0, rows_per_point=1),
        f["noise_multiplier"],
        np.random.default_rng(1),
        noise=weaker,
    )
    assert not std_matches(np.concatenate([w.ravel() for w in weak]), claimed)


def test_one_record_moves_the_gradient_sum_by_at_most_two() -> None:
    """Replace-one on the whole stacked vector (every class block), for random points and
    potentials, same-class and cross-class replacements; the bound is reached by far rows."""
    rng = np.random.default_rng(5)
    worst = 0.0
    for trial in range(300):
        q, m, ell, c = 3, int(rng.integers(1, 6)), 4, float(rng.uniform(0.1, 5))
        x = clip_rows(rng.normal(size=(30, ell)) * c * rng.uniform(0.1, 3), c)
        y = rng.integers(0, q, 30)
        pts = [clip_rows(rng.normal(size=(m, ell)) * c, c) for _ in range(q)]
        gs = [rng.normal(size=m) * 0.1 for _ in range(q)]
        reg = float(rng.choice([1e-3, 0.05, 1.0, 50.0]))
        x2, y2 = x.copy(), y.copy()
        x2[0] = clip_rows(rng.normal(size=(1, ell)) * 10 * c, c)[0]
        y2[0] = rng.integers(0, q) if trial % 2 else y[0]

        def stacked(xs: np.ndarray, ys: np.ndarray, pts=pts, gs=gs, reg=reg, c=c, q=q):
            blocks = [S.record_gradient_sum(xs[ys == k], pts[k], gs[k], reg, c) for k in range(q)]
            return np.concatenate(blocks)

        d = float(np.linalg.norm(stacked(x, y) - stacked(x2, y2)))
        assert d <= S.REPLACE_ONE_SENSITIVITY + 1e-9
        worst = max(worst, d)
    # one synthetic point, the record at +C·e and its replacement at −C·e: ≈ the full 2
    p0 = np.zeros((1, 2))
    far = S.record_gradient_sum(np.array([[1.0, 0.0]]), p0, np.zeros(1), 0.05, 1.0)
    near = S.record_gradient_sum(np.array([[-1.0, 0.0]]), p0, np.zeros(1), 0.05, 1.0)
    assert np.linalg.norm(far - near) == pytest.approx(2.0)
    assert worst > 1.0  # the random pairs exercise the clip, not only tiny moves


@pytest.mark.parametrize(
    "extreme",
    [
        {"sinkhorn_reg": 1e-3},
        {"sinkhorn_reg": 100.0},
        {"clip_norm": 1e-6},
        {"clip_norm": 1e6},
        {"sinkhorn_debias": 1.0, "synthetic_points": 5},
        {"sinkhorn_learning_rate": 1.0, "sinkhorn_steps": 50},
    ],
)
def test_a_peers_extreme_terms_give_finite_points_and_the_same_charge(extreme: dict) -> None:
    """Whatever the target asks within the terms' bounds, the points are finite, inside the
    ball of radius C, and the charge depends on ε, δ, T only (never on λ, p, η, C)."""
    x, y = _data()
    terms = _terms(**extreme)
    rel, entry = _release(x, y, 4, terms)
    assert np.all(np.isfinite(rel.z))
    assert np.all(np.linalg.norm(rel.z, axis=1) <= terms.clip_norm * (1 + 1e-9))
    base = plan_batches(_terms(sinkhorn_steps=terms.sinkhorn_steps), 600, np.eye(12)[:, :10])
    assert entry.params["spec"]["features"]["noise_multiplier"] == pytest.approx(
        base.feature_noise_multiplier
    )


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sinkhorn_reg", 0.0),
        ("sinkhorn_reg", 1e-300),
        ("sinkhorn_reg", float("nan")),
        ("sinkhorn_reg", 1e308),
        ("sinkhorn_steps", 0),
        ("sinkhorn_steps", 10**6),
        ("synthetic_points", 0),
        ("synthetic_points", 101),
        ("sinkhorn_debias", 1.5),
        ("sinkhorn_learning_rate", 0.0),
    ],
)
def test_out_of_range_terms_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ValidationError, match=field):
        _terms(**{field: value})


def test_the_release_is_refused_outside_the_record_unit() -> None:
    with pytest.raises(ValidationError, match="release"):
        _terms(privacy_unit="attribute")


def test_target_reads_labels_and_weights_from_the_noisy_counts() -> None:
    counts = np.array([40, 0, 10])
    assert S.points_per_class(counts, 3, 1).tolist() == [3, 0, 3]
    assert S.points_per_class(counts, 10, 10).tolist() == [4, 0, 1]  # one per 10 noisy rows
    assert S.points_per_class(np.array([0, -2]), 2, 1).tolist() == [1, 1]  # none ≥ 1: all
    assert S.points_per_class(np.array([2**62, 5]), 7, 1).tolist() == [7, 5]  # a lying count
    params = S.SinkhornSyntheticParams(3, 1, 0.05, 0.4, 0.5, 1.0, rows_per_point=1)

    class Rel:
        z = np.arange(12.0).reshape(6, 2)
        noisy_counts = counts

    pts, labels, w = aggregate_points(Rel(), "sinkhorn-synthetic", 3, 0, 10, params)  # type: ignore[arg-type]
    assert labels.tolist() == [0, 0, 0, 2, 2, 2]
    assert w.sum() == pytest.approx(1.0)
    assert w[0] == pytest.approx(4 * w[3])  # each class's mass is its noisy count
    assert pts is Rel.z


def test_release_dependent_defaults_and_explicit_values_win() -> None:
    """sinkhorn-synthetic gives 90% of ε to the gradients and calibrates with the analytic
    Gaussian unless the target says otherwise; prototypes and class-gaussians calibrate exactly
    with their own share, given or not; the attribute unit's rows keep the general defaults;
    the CLI and the target's [job] table leave the choice to the terms."""
    t = _terms()
    assert (t.histogram_share, t.calibration) == (0.1, "analytic")
    t = _terms(histogram_share=0.3, calibration="theorem2")
    assert (t.histogram_share, t.calibration) == (0.3, "theorem2")
    for release in ("prototypes", "class-gaussians"):
        p = _terms(release=release)
        assert (p.histogram_share, p.calibration) == (0.1, "exact")
    default = SessionTerms(dataset="d", epsilon=1.0, delta=1e-5)  # the release not given
    assert (default.release, default.histogram_share, default.calibration) == (
        "prototypes",
        0.1,
        "exact",
    )
    rows = SessionTerms(dataset="d", epsilon=1.0, delta=1e-5, privacy_unit="attribute")
    assert (rows.release, rows.histogram_share, rows.calibration) == ("rows", 0.5, "theorem2")
    assert _terms(histogram_share=None).histogram_share == 0.1  # None: not given

    from dpda.cli.main import build_parser
    from dpda.cli.simulate import terms_from_args as cli_terms

    args = build_parser().parse_args(
        ["simulate", "--dataset", "office-caltech", "--release", "sinkhorn-synthetic"]
    )
    t = cli_terms(args, "office-caltech:C", 1e-5)
    assert (t.histogram_share, t.calibration) == (0.1, "analytic")


@pytest.mark.slow
def test_bench_releases_times_every_record_release_against_prototypes(tmp_path) -> None:
    import json

    from dpda.cli.main import main

    out = tmp_path / "r.json"
    assert main(["bench", "releases", "--rows", "300", "--repeats", "1", "--json", str(out)]) == 0
    runs = json.loads(out.read_text())["runs"]
    assert [r["release"] for r in runs] == ["prototypes", "class-gaussians", "sinkhorn-synthetic"]
    assert all(r["seconds_median"] > 0 and r["vs_prototypes"] > 0 for r in runs)
    assert runs[0]["vs_prototypes"] == 1.0
    assert runs[2]["points_released"] == 10  # 30 rows per class: one point each (one per 70)


def test_the_source_refuses_more_work_than_its_policy_allows() -> None:
    """A release runs under the daemon's lock: the policy bounds its work, before any charge."""
    from dpda.errors import PolicyRefused
    from dpda.policy import PrivacyPolicy, synthetic_work

    x, y = _data()
    k = x.shape[1]
    # per row and step: 10 points × (ℓ + 32), plus 4 classes' debiasing plans
    assert synthetic_work(_terms(sinkhorn_steps=1), 600, 4) == 600 * 10 * 42 + 4 * 100 * 410
    rel, ledger = memory_releaser(
        Domain("d", x, y, 4),
        "d",
        Budget(100, 1e-5),
        np.random.default_rng(0),
        policy=PrivacyPolicy(max_synthetic_work=synthetic_work(_terms(sinkhorn_steps=50), 600, 4)),
    )
    disclosure = TargetDisclosure(Scaling(np.zeros(k), np.ones(k)), np.eye(k)[:, :10])
    rel.open_session(_terms(synthetic_points=10, sinkhorn_steps=50), disclosure)  # at the bound
    with pytest.raises(PolicyRefused, match="more work than this source allows"):
        rel.open_session(_terms(synthetic_points=10, sinkhorn_steps=51), disclosure)
    assert ledger.store.entries("d") == []  # nothing charged


def test_the_papers_per_point_clipping_undercounts() -> None:
    """The seed paper clips ∇_Y OT_λ(X, Y) per *generated* point to Δ and charges 2Δ. Four real
    rows on a line, four synthetic points half a step to their right: moving the leftmost real
    row to the right end shifts the plan along the whole chain, so every point's gradient flips
    (−Δ → +Δ) and the clipped matrix moves by 2Δ·√4 = 4Δ, twice the charged 2Δ. The
    semi-dual sum over real records clipped per record (what dpda releases) moves by ≤ 2."""
    from dpda.ot import fast

    def per_point_clipped(x: np.ndarray, y: np.ndarray, delta: float) -> np.ndarray:
        n, m = len(x), len(y)
        cost = ((x[:, None, :] - y[None, :, :]) ** 2).sum(-1) / 2
        a, b = np.full(n, 1 / n), np.full(m, 1 / m)
        plan, _ = fast.sinkhorn(a, b, cost, 0.01, max_iter=5000, stop_thr=1e-12, dtype=np.float64)
        g = np.stack([m * (plan[:, j, None] * (y[j] - x)).sum(0) for j in range(m)])
        norms = np.linalg.norm(g, axis=1, keepdims=True)
        return g * np.minimum(1.0, delta / np.maximum(norms, 1e-300))

    delta = 0.5
    x = np.array([[0.0], [1.0], [2.0], [3.0]])
    y = x + 0.5
    x2 = x.copy()
    x2[0] = [4.0]
    moved = np.linalg.norm(per_point_clipped(x, y, delta) - per_point_clipped(x2, y, delta))
    assert moved > 1.9 * (2 * delta)  # ≈ 4Δ where 2Δ is charged
    ours = S.record_gradient_sum(x, y, np.zeros(4), 0.01, 4.0) - S.record_gradient_sum(
        x2, y, np.zeros(4), 0.01, 4.0
    )
    assert np.linalg.norm(ours) <= S.REPLACE_ONE_SENSITIVITY + 1e-12


def test_the_floor_applies_to_the_released_gaussian_not_to_each_step() -> None:
    """More steps do not get a session under the policy's noise floor: T steps of σ√T are one
    Gaussian of σ, and σ is what the floor is compared with."""
    from dpda.errors import PolicyRefused
    from dpda.policy import PrivacyPolicy

    x, y = _data()
    k = x.shape[1]
    policy = PrivacyPolicy(min_noise_multiplier=1.0)
    disclosure = TargetDisclosure(Scaling(np.zeros(k), np.ones(k)), np.eye(k)[:, :10])
    for steps in (1, 100):
        rel, ledger = memory_releaser(
            Domain("d", x, y, 4), "d", Budget(100, 1e-5), np.random.default_rng(0), policy=policy
        )
        with pytest.raises(PolicyRefused, match="below the floor"):
            rel.open_session(_terms(epsilon=20.0, sinkhorn_steps=steps), disclosure)
        assert ledger.store.entries("d") == []
