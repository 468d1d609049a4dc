"""Black-box ε audit of prototypes per (class, cell) (terms ``cells``).

The charge is the per-class release's (``LabelBranchDpEvent``): a record that keeps its
(class, cell) moves one sum by ≤ 2C, one that changes cell — within its class or not — moves
two sums by ≤ C each and two counts by one, as a label change does. The partition is drawn
independently of the rows, and the bound holds for every fixed partition; the audit fixes one
the auditor knows (the sign along e), the strongest position, and takes the pair whose row
crosses it without changing class. The same audit with 30% less noise must rise above the
charge. Plumbing and thresholds are those of ``test_epsilon_audit``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dpda.dp.events import branch_of
from dpda.dp.mechanisms import class_sums, clip_rows, label_counts
from dpda.policy import PrivacyPolicy
from dpda.protocol import BatchRelease, TargetDisclosure
from dpda.source_party import batch_draws
from dpda.terms import SessionTerms

from . import test_epsilon_audit as ea

pytestmark = pytest.mark.slow  # thousands of draws per test

E = np.array([0.6, 0.8])


def _by_sign(z: np.ndarray, cells: int, rng: np.random.Generator) -> np.ndarray:
    return (z @ E < 0).astype(np.int64)  # a fixed partition the auditor knows


def test_a_row_that_changes_cell_in_its_class(monkeypatch: pytest.MonkeyPatch) -> None:
    """A row of norm 3 along e (clipped to C·e, cell 0) becomes one along f ⊥ e tilted to the
    other side (clipped, cell 1), same class: two (class, cell) sums move by ≤ C each and two
    counts by one: the label-change branch of the charge, which a histogram share of 0.5 makes
    the larger one. Statistic: the pair's exact privacy loss (Gaussian on the sums, discrete
    Laplace on the counts). ε = 6, C = 1.5, δ_a = 0.2, N = 3000."""
    monkeypatch.setattr(batch_draws, "row_cells", _by_sign)
    terms = SessionTerms(
        dataset=ea.DATASET, epsilon=6.0, delta=ea.DELTA, clip_norm=1.5, cells=2, histogram_share=0.5
    )
    assert terms.projection == "source" and terms.release == "prototypes"
    f = np.array([0.8, -0.6])
    x = np.vstack([3.0 * E, [0.2, -0.4], [1.0, 0.0], [0.3, 0.1]])
    y = np.array([0, 0, 1, 1])
    x2 = x.copy()
    x2[0] = 3.0 * (f - 0.2 * E) / np.linalg.norm(f - 0.2 * E)  # cell 1, class 0
    none = TargetDisclosure(None, None)
    d, dp = ea._pair(x, y, x2, y.copy(), 2, terms, PrivacyPolicy(), none, 47)
    spec = d.spec
    assert spec.features.label_change_sensitivity == pytest.approx(math.sqrt(2) * 1.5)
    charged = ea._joint_event(spec)
    change = ea._claim(branch_of(charged, "label_change"), 0.2)
    assert change == pytest.approx(ea._claim(charged, 0.2))

    def groups(xs: np.ndarray, ys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        z = clip_rows(xs, 1.5)
        g = ys * 2 + _by_sign(z, 2, np.random.default_rng())
        return class_sums(z, g, 4), label_counts(g, 4)

    (s1, c1), (s2, c2) = groups(x, y), groups(x2, y)
    assert np.abs(c1 - c2).sum() == 2  # the row crossed the partition
    shift, mid, var = s1 - s2, (s1 + s2) / 2, spec.features.noise_std**2
    a = spec.histogram.parameter

    def stat(rel: BatchRelease) -> float:
        gauss = float(np.sum((rel.z - mid) * shift)) / var
        c = rel.noisy_counts
        return gauss + a * float(np.sum(np.abs(c - c2) - np.abs(c - c1)))

    ea._check("prototypes per cell, cell change", d, dp, stat, 3000, 0.2, charged, ea._weaker_both)
