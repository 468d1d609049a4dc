"""Random generators: CSPRNG-seeded in production, fixed in tests. Never the global np.random."""

from __future__ import annotations

import secrets

import numpy as np


def secure_rng() -> np.random.Generator:
    """A generator seeded with 256 bits from the operating system's CSPRNG."""
    return np.random.default_rng(secrets.randbits(256))


def make_rng(seed: int | None) -> np.random.Generator:
    """``seed=None`` → CSPRNG-seeded (production); an int → reproducible (tests, simulate)."""
    return secure_rng() if seed is None else np.random.default_rng(seed)
