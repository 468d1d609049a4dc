"""Black-box ε audit of the source's DP standardization (``dpda.dp.preprocessing_dp``).

Each part of the mechanism is audited on its worst-case neighbouring pair against its own part
of the charge (``Composed(Gaussian(σ_c), Gaussian(σ_n))``: a part below its own claim is below
the composed one too), and the same audit with 30% less noise must rise above that claim.
Plumbing and thresholds are those of ``test_epsilon_audit``.
"""

from __future__ import annotations

import numpy as np
import pytest
from dp_accounting import dp_event

from dpda.dp.preprocessing_dp import (
    GRID,
    NORM_GRID,
    column_histograms,
    noisy_columns,
    noisy_norms,
    norm_histogram,
    preprocessing_spec,
)

from .audit import audit_scores
from .test_epsilon_audit import ALPHA, WEAKER, _claim, _report

pytestmark = pytest.mark.slow  # thousands of draws per test


def _audit(name, draw_d, draw_dp, weak_d, weak_dp, claimed, n, delta_a):
    lb = audit_scores(
        np.array([draw_d() for _ in range(n)]),
        np.array([draw_dp() for _ in range(n)]),
        delta_a,
        ALPHA,
    )
    weak = audit_scores(
        np.array([weak_d() for _ in range(n)]),
        np.array([weak_dp() for _ in range(n)]),
        delta_a,
        ALPHA,
    )
    _report(name, claimed, lb, weak, n)
    assert lb.epsilon < claimed, f"{name}: the mechanism leaks more than its charge"
    assert weak.epsilon > claimed, f"{name}: the audit cannot tell 30% less noise apart"


def test_column_histograms_worst_pair() -> None:
    """A row whose every value falls in bin A replaced by one whose every value falls in bin B:
    each of the d histograms moves one count from A to B, ‖Δ‖ = √(2d), the charged sensitivity.
    Statistic: the noisy counts on the direction of the move. d = 4, σ = 0.9 (σ_c ≈ 1.006),
    δ_a = 0.2, N = 3000."""
    d = 4
    x = np.random.default_rng(0).normal(size=(30, d))
    x2 = x.copy()
    x[0], x2[0] = 5e-7, 500.0  # the bin around 0, and a far positive bin, in every column
    move = column_histograms(x) - column_histograms(x2)
    spec = preprocessing_spec(0.9, d, "replace-one", 0.1)
    assert np.linalg.norm(move) == pytest.approx(spec.columns_sensitivity)
    weak = preprocessing_spec(0.9 * WEAKER, d, "replace-one", 0.1)
    claimed = _claim(dp_event.GaussianDpEvent(spec.columns_noise_multiplier), 0.2)
    rng = np.random.default_rng(11)

    def stat(h: np.ndarray) -> float:
        return float(np.sum(h * move))

    _audit(
        "preprocessing column histograms",
        lambda: stat(noisy_columns(x, spec, rng)),
        lambda: stat(noisy_columns(x2, spec, rng)),
        lambda: stat(noisy_columns(x, weak, rng)),
        lambda: stat(noisy_columns(x2, weak, rng)),
        claimed,
        3000,
        0.2,
    )
    assert GRID.size > 0


def test_norm_histogram_worst_pair() -> None:
    """A standardized row of small norm replaced by one of large norm: one count moves between
    two bins, ‖Δ‖ = √2. σ = 0.6 (σ_n ≈ 1.34), δ_a = 0.2, N = 3000."""
    z = np.random.default_rng(1).normal(size=(30, 3))
    z2 = z.copy()
    z[0], z2[0] = [0.01, 0.0, 0.0], [300.0, 0.0, 0.0]
    move = norm_histogram(z).astype(float) - norm_histogram(z2)
    spec = preprocessing_spec(0.6, 3, "replace-one", 0.1)
    assert np.linalg.norm(move) == pytest.approx(spec.norms_sensitivity)
    weak = preprocessing_spec(0.6 * WEAKER, 3, "replace-one", 0.1)
    claimed = _claim(dp_event.GaussianDpEvent(spec.norms_noise_multiplier), 0.2)
    rng = np.random.default_rng(12)

    def stat(h: np.ndarray) -> float:
        return float(h @ move)

    _audit(
        "preprocessing norm histogram",
        lambda: stat(noisy_norms(z, spec, rng)),
        lambda: stat(noisy_norms(z2, spec, rng)),
        lambda: stat(noisy_norms(z, weak, rng)),
        lambda: stat(noisy_norms(z2, weak, rng)),
        claimed,
        3000,
        0.2,
    )
    assert NORM_GRID.size > 0
