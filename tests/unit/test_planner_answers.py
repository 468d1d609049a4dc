"""The planner's answers are the true ones: the size bound on a composition refuses only what
is large, a search that meets the bound says so instead of calling the count too costly, and
the release plan's step count is the one ``dpda privacy epsilon`` confirms."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution

from dpda.cli.main import main
from dpda.dp.accountants import revealed_sampled_gaussian_pld
from dpda.dp.accounting import sampled_gaussian_epsilon
from dpda.dp.calibration import StepsTooLarge, max_revealed_steps, max_sampled_gaussian_steps
from dpda.dp.work_bounds import MAX_PLD_POINTS, fresh_caches, gaussian_pld_points, size_bound
from dpda.planner import plan_batches
from dpda.terms import SessionTerms

# the parameters of the planner's contract: σ, p, ε, δ (add/remove, PLD)
CONTRACT = (0.7, 0.0293242, 5.0, 1.909126e-4)


def _points(pld: privacy_loss_distribution.PrivacyLossDistribution) -> int:
    return max(pld._pmf_remove.size, pld._pmf_add.size)  # type: ignore[attr-defined]


@pytest.mark.parametrize("revealed", [False, True], ids=["poisson", "revealed"])
def test_the_size_estimate_bounds_what_dp_accounting_builds_and_is_not_loose(
    revealed: bool,
) -> None:
    """Above the points the library builds (so the bound keeps gigabytes out) and within 10×
    of them (so a composition of a few hundred thousand points is not refused as millions)."""
    interval = 1e-2  # points scale as 1/interval: a coarse grid keeps the test fast
    ratios = []
    for sigma in (0.5, 0.7, 1.0, 2.0):
        for p in (0.001, 0.03, 0.3, 1.0):
            if revealed:
                step = revealed_sampled_gaussian_pld(sigma, p, interval)
            else:
                step = privacy_loss_distribution.from_gaussian_mechanism(
                    standard_deviation=sigma,
                    sensitivity=1.0,
                    pessimistic_estimate=True,
                    value_discretization_interval=interval,
                    sampling_prob=p,
                )
            for count in (1, 100, 10_000):
                built = _points(step.self_compose(count))
                est = gaussian_pld_points(sigma, count, interval, True, p, revealed)
                assert est >= built, (sigma, p, count, built, est)
                if built > 1000:
                    ratios.append(est / built)
    assert max(ratios) < 10.0


def test_the_contracts_composition_fits_the_size_bound() -> None:
    sigma, p, _, _ = CONTRACT
    assert gaussian_pld_points(sigma, 200, 1e-4, True, p) < MAX_PLD_POINTS / 2


def test_a_step_search_that_meets_the_size_bound_says_so_rather_than_answer() -> None:
    """Under a bound too small for the answer the search raises ``StepsTooLarge`` with a
    checked lower bound; it never returns that lower bound as the maximum."""
    sigma, p, eps, delta = CONTRACT
    with fresh_caches(), size_bound(60_000):
        with pytest.raises(StepsTooLarge) as got:
            max_sampled_gaussian_steps(sigma, p, eps, delta, "pld", 1e-3)
    assert 1 <= got.value.at_least < got.value.too_large
    assert sampled_gaussian_epsilon(sigma, p, got.value.at_least, delta, "pld", 1e-3) <= eps
    with fresh_caches(), size_bound(60_000):
        with pytest.raises(StepsTooLarge):
            max_revealed_steps(0.3, 0.5, 50.0, 1e-5)


@pytest.mark.slow
def test_privacy_steps_gives_the_true_maximum_for_the_contract(tmp_path: Path) -> None:
    """``dpda privacy steps`` on the contract's parameters: within 2% of 200, and ``privacy
    epsilon`` agrees that its count keeps ε and one more does not."""
    sigma, p, eps, delta = CONTRACT
    common = ["--sigma", str(sigma), "--sampling-rate", str(p), "--delta", str(delta)]
    common += ["--accountant", "pld", "--relation", "add-remove"]
    out = tmp_path / "steps.json"
    assert main(["privacy", "steps", *common, "--epsilon", str(eps), "--json", str(out)]) == 0
    steps = json.loads(out.read_text())["steps"]
    assert abs(steps - 200) <= 4
    spent = []
    for t in (steps, steps + 1):
        f = tmp_path / f"eps{t}.json"
        assert main(["privacy", "epsilon", *common, "--steps", str(t), "--json", str(f)]) == 0
        spent.append(json.loads(f.read_text())["epsilon"])
    assert spent[0] <= eps < spent[1]


def test_the_release_plans_steps_are_those_privacy_epsilon_confirms(tmp_path: Path) -> None:
    """A minibatch plan that asks for as many steps as the budget allows (``steps`` 0): its
    count keeps the DPDA share per ``dpda privacy epsilon --relation attribute`` and one more
    step would not."""
    terms = SessionTerms(
        dataset="d",
        epsilon=12.0,
        delta=1e-5,
        privacy_unit="attribute",
        neighbouring="add-remove",
        batch_size=50,
        noise_multiplier=3.0,
        steps=0,
        max_steps=100_000,
    )
    plan = plan_batches(terms, 1000, np.eye(6)[:, :4])
    assert 1 <= plan.steps < terms.max_steps
    spent = []
    for t in (plan.steps, plan.steps + 1):
        f = tmp_path / f"eps{t}.json"
        args = ["privacy", "epsilon", "--relation", "attribute", "--accountant", "pld"]
        args += ["--sigma", repr(plan.feature_noise_multiplier)]
        args += ["--sampling-rate", repr(plan.sampling_rate), "--delta", repr(terms.delta)]
        assert main([*args, "--steps", str(t), "--json", str(f)]) == 0
        spent.append(json.loads(f.read_text())["epsilon"])
    assert spent[0] <= terms.epsilon - terms.pate_epsilon < spent[1]
