"""Black-box ε audit of the source-space aggregates with enforced non-negative rows.

The terms ``nonnegative_rows`` make the source map every row to ``max(x, 0)`` before clipping,
and the charge uses the same-label bound √2·C (prototypes) and 2 (class-gaussians) instead of
2C and 3/√2 (``mechanisms.aggregate_sensitivity``, ``class_gaussians_sensitivity``). Each test
audits the worst-case pair under the *new* bound against the branch of the charge the pair
belongs to (``LabelBranchDpEvent``: on a same-label pair the same-label event dominates the
release; its ε is at most the whole charge's), and the same audit with 30% less noise must rise
above it. One more check shows the clamp is what the bound rests on: the same release drawn
without the clamp, on the pair x → −x, is caught above the claim. Plumbing and thresholds are
those of ``test_epsilon_audit``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpda.dp.events import branch_of
from dpda.policy import PrivacyPolicy
from dpda.protocol import BatchRelease, TargetDisclosure
from dpda.terms import SessionTerms

from .audit import audit_scores
from .test_epsilon_audit import (
    ALPHA,
    DATASET,
    DELTA,
    _check,
    _claim,
    _joint_event,
    _pair,
    _report,
    _weaker_features,
)

pytestmark = pytest.mark.slow  # thousands of draws per test


def _terms(release: str, clip: float) -> SessionTerms:
    terms = SessionTerms(
        dataset=DATASET, epsilon=6.0, delta=DELTA, clip_norm=clip, release=release,
        nonnegative_rows=True,
    )  # fmt: skip
    assert terms.projection == "source" and terms.calibration == "exact"
    return terms


def test_nonnegative_prototypes_same_label() -> None:
    """Worst case under the clamp: a row of norm 3 along e₁ (clipped to C·e₁) becomes one
    along e₂, same class: the class sum moves by C(e₁ − e₂), norm √2·C, the charged same-label
    sensitivity. Statistic: the class sum on e₁ − e₂. ε = 6, C = 1.5, δ_a = 0.2, N = 3000."""
    terms = _terms("prototypes", 1.5)
    x = np.array([[3.0, 0.0, 0.0], [0.2, 0.4, 0.1], [1.0, 0.0, 0.3], [0.3, 0.1, 0.2]])
    y = np.array([0, 0, 1, 1])
    x2 = x.copy()
    x2[0] = [0.0, 3.0, 0.0]
    d, dp = _pair(x, y, x2, y.copy(), 2, terms, PrivacyPolicy(), TargetDisclosure(None, None), 61)
    f = d.spec.features
    assert f.sensitivity == pytest.approx(math.sqrt(2) * terms.clip_norm)
    assert f.label_change_sensitivity == pytest.approx(math.sqrt(2) * terms.clip_norm)
    assert d.entry.params["nonnegative_rows"] is True  # the ledger records what the bound rests on
    charged = _joint_event(d.spec)
    same = branch_of(charged, "same_label")
    assert _claim(same, 0.2) <= _claim(charged, 0.2)
    w = np.array([1.0, -1.0, 0.0]) / math.sqrt(2)

    def stat(rel: BatchRelease) -> float:
        return float(rel.z[0] @ w)

    _check("nonnegative prototypes, same label", d, dp, stat, 3000, 0.2, same, _weaker_features)


def test_the_clamp_is_what_the_bound_rests_on() -> None:
    """The pair x → −x (same label). With the clamp, −x becomes 0 and the class sum moves by C
    only; without it (the same √2·C noise, rows not clamped) by 2C, and the audit catches it
    above the claim: the √2·C charge is sound only because the source enforces the orthant."""
    terms = _terms("prototypes", 1.5)
    e = np.array([0.6, 0.8, 0.0])
    x = np.vstack([3.0 * e, [0.2, 0.4, 0.1], [1.0, 0.0, 0.3], [0.3, 0.1, 0.2]])
    y = np.array([0, 0, 1, 1])
    x2 = x.copy()
    x2[0] = -3.0 * e
    d, dp = _pair(x, y, x2, y.copy(), 2, terms, PrivacyPolicy(), TargetDisclosure(None, None), 63)
    same = branch_of(_joint_event(d.spec), "same_label")
    claimed = _claim(same, 0.2)

    def stat(rel: BatchRelease) -> float:
        return float(rel.z[0] @ e)

    lb = audit_scores(d.draws(3000, stat), dp.draws(3000, stat), 0.2, ALPHA)
    unclamped = terms.model_copy(update={"nonnegative_rows": False})
    d.terms, dp.terms = unclamped, unclamped
    leak = audit_scores(d.draws(3000, stat), dp.draws(3000, stat), 0.2, ALPHA)
    _report("nonnegative prototypes, clamp skipped", claimed, lb, leak, 3000)
    assert lb.epsilon < claimed
    assert leak.epsilon > claimed, "a release without the clamp is not told apart"


def test_nonnegative_class_gaussians_same_label() -> None:
    """Worst case of the block [u, u∘u] over non-negative u, v of norm ≤ 1: u = e₁, v = e₂,
    ‖(u − v, u∘u − v∘v)‖ = 2, the charged same-label sensitivity (3/√2 without the clamp).
    C = 2 checks the normalised units. ε = 6, δ_a = 0.3, N = 5000."""
    c = 2.0
    terms = _terms("class-gaussians", c)
    x = np.array([[2.0 * c, 0.0], [0.3, 0.1], [1.0, 0.5]])
    y = np.array([0, 0, 1])
    x2 = x.copy()
    x2[0] = [0.0, 2.0 * c]
    d, dp = _pair(x, y, x2, y.copy(), 2, terms, PrivacyPolicy(), TargetDisclosure(None, None), 65)
    assert d.spec.features.sensitivity == pytest.approx(2.0)
    u, v = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    shift = np.concatenate([u - v, u * u - v * v])
    assert np.linalg.norm(shift) == pytest.approx(2.0)
    direction = shift / 2.0
    same = branch_of(_joint_event(d.spec), "same_label")

    def stat(r: BatchRelease) -> float:
        block = np.concatenate([r.z[0, :2] / c, r.z[0, 2:] / (c * c)])
        return float(block @ direction)

    _check("nonnegative class-gaussians", d, dp, stat, 5000, 0.3, same, _weaker_features)
