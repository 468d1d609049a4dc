"""The target's own disclosures under DP (issue 19, ``dpda.dp.target_disclosure``): the noise
drawn is the plan's, the sensitivities hold on the whole map, the charge is the plan's ε."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpda.data.synthetic import two_domains
from dpda.dp import target_disclosure as T
from dpda.dp.ledger import spend_of


def test_the_plan_spends_its_epsilon_and_splits_it_by_the_shares() -> None:
    for eps in (0.5, 1.0, 4.0):
        plan = T.plan_disclosure(eps, 1e-5, 40, "sqrt")
        assert spend_of(plan.events(), 1e-5) == pytest.approx(eps, rel=1e-3)
        s, q, c = plan.sigmas
        assert s == q and c < s  # the covariance gets the largest share
        jl = T.plan_disclosure(eps, 1e-5, 40, "sqrt", with_basis=False)
        assert not jl.with_basis and len(jl.events()) == 2
        assert spend_of(jl.events(), 1e-5) == pytest.approx(eps, rel=1e-3)
    with pytest.raises(ValueError, match="row_clip"):
        T.plan_disclosure(1.0, 1e-5, 40, "raw")


@pytest.mark.slow
def test_the_noise_drawn_is_the_plans() -> None:
    """On all-zero rows every released value is pure noise: its spread is the plan's std."""
    plan = T.plan_disclosure(2.0, 1e-5, 6, "l2")
    std_s, std_q, std_c = plan.noise_stds()
    assert std_s == pytest.approx(plan.sigmas[0] * 2 * plan.row_clip)
    assert std_c == pytest.approx(plan.sigmas[2] * math.sqrt(2) * (T.Z_CLIP**2 * 6.0))
    rng = np.random.default_rng(0)
    r = np.zeros((50, 6))
    means = np.array([T.dp_scaling(r, plan, "zscore", rng).mean for _ in range(4000)])
    assert np.std(means * 50) == pytest.approx(std_s, rel=0.03)
    covs = np.array([T.dp_covariance(r, plan, rng) for _ in range(2000)])
    assert np.allclose(covs, covs.transpose(0, 2, 1))  # symmetric noise
    assert np.std(covs[:, 1, 4]) == pytest.approx(std_c, rel=0.05)
    assert np.std(covs[:, 2, 2]) == pytest.approx(std_c, rel=0.05)


def test_replacing_one_row_moves_each_statistic_by_at_most_its_sensitivity() -> None:
    """Sums ≤ 2C, sums of squares ≤ √2·C², Σ z zᵀ (Frobenius) ≤ √2·C_z², on random rows and on
    adversarial ones (a row at the clip in another orthant, a row of 10⁶)."""
    rng = np.random.default_rng(1)
    k, c = 8, 1.0
    cz = T.Z_CLIP * math.sqrt(k)
    worst = np.zeros(3)
    for trial in range(400):
        a = rng.normal(size=k) * rng.choice([0.1, 1.0, 1e6])
        b = -a if trial % 3 == 0 else rng.normal(size=k) * rng.choice([0.1, 1.0, 1e6])
        ra, rb = T._clip(a[None], c)[0], T._clip(b[None], c)[0]
        worst[0] = max(worst[0], np.linalg.norm(ra - rb) / (2 * c))
        worst[1] = max(worst[1], np.linalg.norm(ra * ra - rb * rb) / (math.sqrt(2) * c * c))
        za, zb = T._clip(a[None] * 10, cz)[0], T._clip(b[None] * 10, cz)[0]
        diff = np.outer(za, za) - np.outer(zb, zb)
        worst[2] = max(worst[2], np.linalg.norm(np.triu(diff)) / (math.sqrt(2) * cz * cz))
    assert np.all(worst <= 1 + 1e-12), worst
    assert worst[0] > 0.99  # the bound is reached (antipodal rows at the clip)


def test_the_disclosure_is_not_the_exact_statistic_and_the_basis_is_orthonormal() -> None:
    from dpda.data.preprocessing import Scaling, per_row
    from dpda.target_party.view import target_pca_basis

    _, t = two_domains()
    plan = T.plan_disclosure(4.0, 1e-4, t.x.shape[1], "raw", row_clip=20.0)
    d = T.disclose(t.x, "raw", "zscore", 5, plan, np.random.default_rng(2))
    exact = Scaling.of(per_row(t.x, "raw"), "zscore")
    assert not np.allclose(d.scaling.mean, exact.mean)
    assert np.allclose(d.basis.T @ d.basis, np.eye(5), atol=1e-10)
    assert not np.allclose(np.abs(d.basis), np.abs(target_pca_basis(exact.apply(t.x), 5)))
    assert d.clip_norm > 0 and math.isfinite(d.clip_norm)


@pytest.mark.slow
def test_simulate_reports_the_targets_own_charge() -> None:
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import SessionTerms

    src, tgt = two_domains(300, 250)
    terms = SessionTerms(
        dataset="s", epsilon=4.0, delta=1e-3, projection="target-pca", projection_dim=5
    )
    out = simulate(
        src, tgt, terms, "raw", AdaptConfig(select="none"), 0, baselines=False,
        target_epsilon=2.0, target_row_clip=20.0,
    )  # fmt: skip
    data = out.to_json(terms)
    assert data["target_disclosures"] == "dp"
    assert data["target_epsilon_spent"] == pytest.approx(2.0, rel=1e-3)
    assert data["target_delta"] == pytest.approx(1 / 2500)
    exact = simulate(src, tgt, terms, "raw", AdaptConfig(select="none"), 0, baselines=False)
    assert exact.to_json(terms)["target_epsilon_spent"] is None


def test_a_configured_row_clip_at_its_bounds_plans_drawable_noise() -> None:
    """``[privacy] row_clip`` runs from 1e-6 to 1e6: at both ends and every ε the plan's noise
    is one the sampler draws (checked before anything is charged), and 1e-300 is refused by the
    config."""
    from pydantic import ValidationError

    from dpda.dp.mechanisms import MIN_GAUSSIAN_STD
    from dpda.policy import TargetPrivacyPolicy

    for clip in (1e-6, 1e6):
        for eps in (0.01, 100.0):
            for basis in (True, False):
                plan = T.plan_disclosure(eps, 1e-5, 800, "raw", clip, with_basis=basis)
                used = plan.noise_stds()[: 3 if basis else 2]
                assert all(MIN_GAUSSIAN_STD <= s < math.inf for s in used)
    with pytest.raises(ValidationError, match="row_clip"):
        TargetPrivacyPolicy(row_clip=1e-300)


def test_row_queries_noise_is_the_plans_and_a_bad_clip_is_refused_before_any_draw() -> None:
    """``noisy_rows``: rows clipped to C, then N(0, (σ_r·2C)²) per coordinate (on zero rows the
    spread is the plan's std); the plan spends its ε; a clip of 0, 1e-300, inf or NaN is a
    ``ValueError`` from ``query_noise_std`` (what the target checks before its charge)."""
    plan = T.plan_row_queries(4.0, 1e-5)
    assert spend_of(plan.events(), 1e-5) == pytest.approx(4.0, rel=1e-3)
    clip = 0.7
    noise = T.noisy_rows(np.zeros((20000, 3)), clip, plan, np.random.default_rng(0))
    assert np.std(noise) == pytest.approx(plan.noise_multiplier * 2 * clip, rel=0.02)
    far = T.noisy_rows(np.array([[1e6, 0.0]]), clip, plan, np.random.default_rng(1))
    near = T.noisy_rows(np.array([[clip, 0.0]]), clip, plan, np.random.default_rng(1))
    assert np.allclose(far, near)  # the row was clipped to C before the noise
    for bad in (0.0, 1e-300, math.inf, math.nan, -1.0):
        with pytest.raises(ValueError, match="clip_norm"):
            T.query_noise_std(plan, bad)


def test_synthetic_points_follow_the_released_variances() -> None:
    v = np.array([4.0, 1.0, 0.0])
    pts = T.synthetic_queries(v, 20000, np.random.default_rng(0))
    assert np.allclose(np.var(pts, axis=0), v, atol=0.1)
    d = T.disclose(
        two_domains()[1].x,
        "raw",
        "zscore",
        4,
        T.plan_disclosure(4.0, 1e-4, 40, "raw", 15.0),
        np.random.default_rng(0),
    )
    assert d.variances.shape == (4,) and np.all(d.variances >= 0)
    assert d.clip_norm == pytest.approx(math.sqrt(max(float(d.variances.sum()), 1e-12)))


@pytest.mark.slow
def test_dp_row_queries_never_choose_rows_by_the_data(monkeypatch) -> None:
    """Under ``row_queries = "dp"`` DPDA+PATE must not pick its rows with the plan (a choice that
    depends on every target row would break the 2C sensitivity); the exact opt-in does, so the
    trap below is live."""
    import dpda.target_party.arms as arms
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import SessionTerms

    def trap(*_a: object, **_k: object) -> None:
        raise AssertionError("rows chosen by the plan")

    monkeypatch.setattr(arms, "select_rows", trap)
    src, tgt = two_domains()
    terms = SessionTerms(dataset="synthetic", epsilon=4.0, delta=1e-4, projection_dim=6)
    kw = dict(baselines=False, methods=("dpda+pate",), pate_queries=30, target_epsilon=4.0,
              target_row_clip=15.0)  # fmt: skip
    out = simulate(src, tgt, terms, "raw", AdaptConfig(), 1, target_row_queries="dp", **kw)
    assert out.runs["dpda+pate"].pate_queries == 30
    assert out.target_epsilon_spent is not None and out.target_epsilon_spent > 4.0
    with pytest.raises(AssertionError, match="chosen by the plan"):
        simulate(src, tgt, terms, "raw", AdaptConfig(), 1, target_row_queries="exact", **kw)
