"""Spend what the user grants, and never more: the planned charge of the record-unit aggregate
releases (prototypes, class-gaussians) under the exact calibration, on an Office-Caltech-sized
dataset (n = 1123, δ = 1/(10n)), against the charge of the composition it replaces."""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import dp_event

from dpda.dp.calibration import sigma_theorem2
from dpda.dp.events import LabelBranchDpEvent
from dpda.dp.ledger import spend_of
from dpda.planner import plan_batches
from dpda.terms import SessionTerms

pytestmark = pytest.mark.slow  # a calibration per case, ~0.1–0.8 s each

N = 1123
DELTA = 1 / (10 * N)


def _planned(epsilon: float, release: str, **extra: object) -> tuple[SessionTerms, float, float]:
    terms = SessionTerms(dataset="oc", epsilon=epsilon, delta=DELTA, release=release, **extra)
    plan = plan_batches(terms, N, np.eye(50))
    return terms, plan.feature_noise_multiplier, spend_of(plan.events(terms), DELTA)


@pytest.mark.parametrize("release", ["prototypes", "class-gaussians"])
@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
@pytest.mark.parametrize("share", [0.05, 0.1, 0.3, 0.5])
def test_the_planned_spend_is_what_is_granted(release: str, epsilon: float, share: float) -> None:
    terms, _, spent = _planned(epsilon, release, histogram_share=share)
    assert terms.calibration == "exact"
    assert 0.99 * epsilon <= spent <= epsilon


def _old_charge(epsilon: float) -> float:
    """The composition charged before: Theorem-2 σ for (1 − h)ε with h = 0.5, DLap(hε/2, 2)."""
    sigma = sigma_theorem2(0.5 * epsilon, DELTA)
    old = dp_event.ComposedDpEvent(
        [dp_event.GaussianDpEvent(sigma), dp_event.DiscreteLaplaceDpEvent(0.25 * epsilon, 2)]
    )
    return spend_of([old], DELTA)


@pytest.mark.parametrize(
    ("epsilon", "old_spend", "old_sigma", "new_sigma"),
    [(2.0, 1.6727, 4.3894, 1.7481), (8.0, 6.9043, 1.2566, 0.5461)],
)
def test_the_loose_charge_is_gone(
    epsilon: float, old_spend: float, old_sigma: float, new_sigma: float
) -> None:
    """Before: ε = 2 charged 1.673 at σ = 4.39 and ε = 8 charged 6.904 at σ = 1.257. Now the
    defaults spend the whole ε at a σ 2.3–2.5× smaller; theorem2 and analytic stay selectable,
    and are charged the joint event too (less than the old composition at the same noise)."""
    assert _old_charge(epsilon) == pytest.approx(old_spend, abs=1e-4)
    terms, sigma, spent = _planned(epsilon, "prototypes")
    print(
        f"\nSPEND ε={epsilon:g} n={N}: before {_old_charge(epsilon):.4f} (σ {old_sigma}), "
        f"after {spent:.4f} (σ {sigma:.4f}, share {terms.histogram_share})"
    )
    assert spent >= 0.99 * epsilon and spent <= epsilon
    assert sigma == pytest.approx(new_sigma, abs=1e-4)
    old_terms, theorem2_sigma, joint = _planned(
        epsilon, "prototypes", calibration="theorem2", histogram_share=0.5
    )
    assert theorem2_sigma == pytest.approx(old_sigma, abs=1e-4)
    plan = plan_batches(old_terms, N, np.eye(50))
    assert isinstance(plan.spec(old_terms).dp_event(), LabelBranchDpEvent)
    assert joint < old_spend - 0.05
