"""What a release will be worth, from public facts only: the forecast ``dpda target plan``
prints before anything is spent and ``dpda simulate`` prints beside its rehearsal."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpda.planner import ReleasePlan
from dpda.terms import SessionTerms

# noise-to-signal of a class mean above which a release is noise-dominated: the measured
# boundary between the Office-Caltech sources that DPDA helps and the small ones it does not
# (docs/results.md, forecast)
NOISE_DOMINATED = 0.25


def forecast(
    terms: SessionTerms, plan: ReleasePlan, n_rows: int, n_classes: int, target_rows: int
) -> dict[str, Any]:
    """What the release will be worth, from public facts only (rows, classes, ε, δ, σ, C, ℓ):
    the noise-to-signal of a class mean, its noise norm over the OT space's ℓ directions
    (σ·Δ·√ℓ / (n/q)) relative to the largest norm a row may have (C), for a class of
    average size. Above ``NOISE_DOMINATED`` the class means are mostly noise: the job says so
    and what would change it."""
    q = max(1, n_classes)
    ell = min(terms.projection_dim, target_rows)
    rows_per_class = n_rows / q
    if terms.privacy_unit != "record" or terms.release == "rows":
        # a noisy row per record: its noise against a row's own scale
        ratio = plan.feature_noise_multiplier * plan.feature_sensitivity * float(np.sqrt(ell))
        ratio /= max(terms.clip_norm, 1e-300)
        per = "row"
    else:
        std = plan.feature_noise_multiplier * plan.feature_sensitivity
        ratio = std * float(np.sqrt(ell)) / (rows_per_class * terms.clip_norm)
        per = "class mean"
    dominated = bool(ratio > NOISE_DOMINATED)
    advice = []
    if dominated:
        need = ratio / NOISE_DOMINATED
        advice.append(
            f"about {need:.1f}× more rows per class, or a σ {need:.1f}× smaller (a larger "
            "epsilon), would bring it under the noise-dominated line"
        )
        if terms.projection_dim > 10:
            advice.append("a smaller projection_dim spreads the same noise over fewer directions")
    return {
        "noise_to_signal": ratio,
        "per": per,
        "rows_per_class": rows_per_class,
        "noise_dominated": dominated,
        "threshold": NOISE_DOMINATED,
        "advice": advice,
    }
