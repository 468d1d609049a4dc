"""Statistical checks of drawn noise against a claimed scale (shared by the noise tests)."""

from __future__ import annotations

import numpy as np


def std_matches(samples: np.ndarray, claimed_std: float, rel_tol: float = 0.06) -> bool:
    """True when the sample standard deviation is within ``rel_tol`` of the claim.

    With N ≥ 10⁴ samples the sample std has relative error ≈ 1/√(2N) < 1%, so a 6% band accepts
    the right scale with overwhelming probability and rejects a scale 30% off with certainty.
    """
    samples = np.asarray(samples, dtype=float).ravel()
    assert samples.size >= 10_000, "too few samples for the check to mean anything"
    return (
        abs(samples.std() / claimed_std - 1.0) < rel_tol
        and abs(samples.mean()) < 0.05 * claimed_std + 0.05
    )
