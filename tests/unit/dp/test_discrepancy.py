"""Seed 001's private discrepancy minimisation (groundwork for the reverse setting): the smooth
approximation, the gradient's sensitivity to one target row, the accounting of the private
steps, and the bench's contract."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dpda.dp import discrepancy as D


def _problem(seed: int, m: int = 40, n: int = 25, d: int = 5):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(m, d)) * 0.5
    t = D.clip_rows_to(rng.normal(size=(n, d)), 1.0)
    q = rng.dirichlet(np.ones(m))
    return x, t, q


@pytest.mark.parametrize("mu", [1.0, 20.0, 200.0])
def test_smooth_approximation_bounds_and_gradient(mu: float) -> None:
    x, t, q = _problem(0)
    mom = D.second_moment(t)
    value, grad = D.smooth_discrepancy_grad(q, x, mom, mu)
    exact = D.discrepancy(q, x, mom)
    assert exact <= value <= exact + math.log(2 * x.shape[1]) / mu + 1e-12
    h = 1e-6
    for i in (0, 7, 39):
        e = np.zeros_like(q)
        e[i] = h
        up, _ = D.smooth_discrepancy_grad(q + e, x, mom, mu)
        down, _ = D.smooth_discrepancy_grad(q - e, x, mom, mu)
        assert grad[i] == pytest.approx((up - down) / (2 * h), rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("mu", [1.0, 20.0, 200.0])
def test_one_target_row_moves_the_gradient_by_at_most_the_stated_sensitivity(mu: float) -> None:
    """|∇_i F̃(T) − ∇_i F̃(T′)| ≤ μ·R²·r²/n for every i, replacing one clipped row by random
    and extreme rows (the derivation in the module docstring)."""
    worst = 0.0
    for seed in range(40):
        x, t, q = _problem(seed)
        rng = np.random.default_rng(100 + seed)
        radius = float(np.max(np.linalg.norm(x, axis=1)))
        bound = D.gradient_sensitivity(mu, radius, 1.0, t.shape[0])
        t2 = t.copy()
        t2[int(rng.integers(t.shape[0]))] = D.clip_rows_to(rng.normal(size=(1, 5)) * 10, 1.0)[0]
        _, g1 = D.smooth_discrepancy_grad(q, x, D.second_moment(t), mu)
        _, g2 = D.smooth_discrepancy_grad(q, x, D.second_moment(t2), mu)
        moved = float(np.max(np.abs(g1 - g2)))
        assert moved <= bound * (1 + 1e-9)
        worst = max(worst, moved / bound)
    assert worst > 0.01  # the check is exercised, not vacuous


def test_the_private_steps_spend_at_most_epsilon() -> None:
    """Frank–Wolfe: T exponential-mechanism steps charged as T·ε₀²/8 zCDP, never more than the
    pure composition T·ε₀; the calibrated ε₀ and mirror descent's σ spend at most ε."""
    delta = 1 / 8000
    for eps, steps in ((0.5, 300), (8.0, 1000)):
        eps0 = D.frank_wolfe_step_epsilon(eps, delta, steps)
        spent = D.epsilon_of_event(D.frank_wolfe_event(eps0, steps), delta)
        assert spent <= eps and spent > 0.95 * eps
        assert spent <= steps * eps0
        sigma = D.mirror_descent_sigma(eps, delta, steps)
        assert D.epsilon_of_event(D.mirror_descent_event(sigma, steps), delta) <= eps


@pytest.mark.slow
def test_bench_public_source_quick_contract(tmp_path) -> None:
    from dpda.cli.main import main

    out, png = tmp_path / "ps.json", tmp_path / "ps.png"
    assert main(["bench", "public-source", "--quick", "--png", str(png), "--json", str(out)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = json.loads(out.read_text())["rows"]
    assert {r["method"] for r in rows} == {
        "noisy-fw",
        "noisy-md",
        "single-stage",
        "public-only",
        "oracle",
    }
    assert {r["n_target"] for r in rows} == {1000, 4000}
    for r in rows:
        assert {"method", "epsilon", "n_target", "mse", "discrepancy"} <= set(r)
        if r["epsilon_spent"] is not None:
            assert r["epsilon_spent"] <= r["epsilon"]

    def dis(method: str, n: int, eps: float) -> float:
        return next(
            r["discrepancy"]
            for r in rows
            if r["method"] == method and r["n_target"] == n and r["epsilon"] == eps
        )

    # the paper's orderings on the weights: noisy FW improves with ε and with n, beats MD
    assert dis("noisy-fw", 4000, 8.0) < dis("noisy-fw", 4000, 0.5)
    assert dis("noisy-fw", 4000, 8.0) < dis("noisy-fw", 1000, 8.0)
    assert dis("noisy-fw", 4000, 8.0) < dis("noisy-md", 4000, 8.0)
    assert dis("noisy-fw", 4000, 8.0) < dis("public-only", 4000, 8.0)


@pytest.mark.slow
def test_bench_public_source_on_benchmark_features(tmp_path, data_dir) -> None:
    """The classification task: the source public, the target's rows private; the private
    weights spend at most ε and the three accuracies are measured on the target's labels."""
    from dpda.cli.main import main

    out = tmp_path / "cls.json"
    argv = ["bench", "public-source", "--task", "benchmark", "--pairs", "D:W", "--quick"]
    assert main([*argv, "--seeds", "1", "--data-dir", str(data_dir), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["epsilon"] for r in rows] == [1.0, 8.0]
    for r in rows:
        assert r["epsilon_spent"] <= r["epsilon"]
        assert set(r["accuracy"]) == {
            "source_only",
            "private_reweighting",
            "non_private_reweighting",
        }
        assert all(0 <= a <= 100 for a in r["accuracy"].values())
        d = r["discrepancy"]
        assert d["non_private_reweighting"] < d["source_only"]  # the minimisation works


def test_exponential_mechanism_event_in_both_accountants() -> None:
    """One step: PLD gives ε₀ at a tiny δ (the generic ε₀-DP bound); T steps never exceed the
    pure composition Tε₀ in either accountant, and RDP (bounded range) is the tighter one; the
    event survives the ledger's JSON round trip."""
    from dpda.dp.accounting import epsilon_of
    from dpda.dp.events import ExponentialMechanismDpEvent, event_from_json, event_to_json

    one = ExponentialMechanismDpEvent(0.7)
    assert epsilon_of([one], 1e-12, "pld", 1e-4) == pytest.approx(0.7, abs=2e-3)
    many = D.frank_wolfe_event(0.05, 400)
    pld, rdp = epsilon_of([many], 1e-5, "pld"), epsilon_of([many], 1e-5, "rdp")
    assert rdp < pld <= 400 * 0.05
    assert event_from_json(event_to_json(many)) == many
    with pytest.raises(ValueError):
        ExponentialMechanismDpEvent(float("nan"))


def test_exponential_select_is_the_exponential_mechanism() -> None:
    """The Gumbel-max sampler draws index i with probability ∝ exp(−ε·loss_i/(2Δ))."""
    loss = np.array([0.0, 1.0, 2.0])
    want = np.exp(-2.0 * loss / 2.0)
    want /= want.sum()
    rng = np.random.default_rng(0)
    got = np.bincount(
        [D.exponential_select(loss, 2.0, 1.0, rng) for _ in range(20000)], minlength=3
    )
    assert np.allclose(got / 20000, want, atol=0.01)


@pytest.mark.slow
def test_simulate_public_source_setting(tmp_path, data_dir) -> None:
    """``dpda simulate --setting public-source``: the contract's keys, ε spent ≤ ε, predictions
    written; on your own files the unlabeled target gets predictions and no accuracy."""
    from dpda.cli.main import main
    from dpda.data.synthetic import two_domains

    out = tmp_path / "pub.json"
    argv = ["simulate", "--dataset", "office-caltech", "--source", "D", "--target", "W"]
    argv += ["--setting", "public-source", "--epsilon", "2", "--seed", "0", "--json", str(out)]
    assert main([*argv, "--data-dir", str(data_dir)]) == 0
    data = json.loads(out.read_text())
    assert data["setting"] == "public-source" and 0 < data["epsilon_spent"] <= 2.0
    assert set(data["accuracy"]) == {"source_only", "dpda", "non_private_reweighting"}
    assert all(0 <= v <= 100 for v in data["accuracy"].values())
    assert len((tmp_path / "pub.predictions.csv").read_text().splitlines()) == 295 + 1

    src, tgt = two_domains(n_source=200, n_target=150, k=8)
    header = ",".join(f"f{i}" for i in range(8))
    np.savetxt(
        tmp_path / "s.csv",
        np.column_stack([src.x, src.y]),
        delimiter=",",
        header=header + ",label",
        comments="",
    )
    np.savetxt(tmp_path / "t.csv", tgt.x, delimiter=",", header=header, comments="")
    own = tmp_path / "own.json"
    argv = ["simulate", "--source-file", str(tmp_path / "s.csv"), "--target-file"]
    argv += [str(tmp_path / "t.csv"), "--label-column", "label", "--setting", "public-source"]
    assert main([*argv, "--json", str(own)]) == 0
    mine = json.loads(own.read_text())
    assert mine["accuracy"]["dpda"] is None  # no target labels: nothing to score
    assert len((tmp_path / "own.predictions.csv").read_text().splitlines()) == 150 + 1
