"""Preprocessing under the rule of docs/privacy-model.md: nothing computed from the whole
private dataset.

Per-row operations (dividing a row by its own sum, square roots, L2 normalization) are DP-clean.
Column scaling uses *public* statistics: the target's own mean/std, which the target sends (a
disclosure by the target, logged on its side). ``zscore_own`` exists only for the non-private
1-NN baselines and for the target's own data.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

ROW_BLOCK = 65_536  # rows a per-row map reads at a time (a few tens of MB of temporaries)


def by_row_blocks(x: np.ndarray, f: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``f`` (a per-row map to float64 rows of the same width) applied a block of rows at a
    time, into one new array: the same rows as ``f(x)``, with a block's temporaries instead of
    the whole table's."""
    out = np.empty(x.shape, dtype=np.float64)
    for i in range(0, x.shape[0], ROW_BLOCK):
        out[i : i + ROW_BLOCK] = f(x[i : i + ROW_BLOCK])
    return out


def row_normalize(x: np.ndarray) -> np.ndarray:
    s = x.sum(axis=1, keepdims=True)
    return x / np.where(s == 0, 1.0, s)


def l2_normalize(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(n == 0, 1.0, n)


@dataclass(frozen=True)
class Scaling:
    """Column statistics published by the target: ``(x − mean) / std`` (population std)."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def of(cls, x: np.ndarray, mode: str = "zscore", floor: float = 0.1) -> Scaling:
        """Column means and a scale per column computed on the target's own data.

        ``zscore``: population std per column, floored at ``floor`` × the mean std (a feature
        that is almost constant on the target would otherwise blow up any source row that is not
        constant there). ``uniform``: one scale for all columns, the root mean square of the
        column stds — better when features share units (pixels: the empty MNIST borders).
        """
        return cls.from_moments(x.mean(axis=0), x.std(axis=0), mode, floor)

    @classmethod
    def from_moments(
        cls, mean: np.ndarray, std: np.ndarray, mode: str = "zscore", floor: float = 0.1
    ) -> Scaling:
        """The scaling of columns with these means and standard deviations (exact, or the DP
        ones of ``dpda.dp.target_disclosure``): the rule of ``of``."""
        if mode == "uniform":
            rms = float(np.sqrt(np.mean(std**2))) if std.size else 1.0
            return cls(mean, np.full_like(std, rms if rms > 0 else 1.0))
        if mode != "zscore":
            raise ValueError(f"unknown scaling mode {mode!r}")
        lo = floor * float(std.mean()) if std.size and std.mean() > 0 else 1.0
        return cls(mean, np.maximum(std, lo))

    def apply(self, x: np.ndarray) -> np.ndarray:
        return (x - self.mean) / self.std


def zscore_own(x: np.ndarray) -> np.ndarray:
    return Scaling.of(x).apply(x)


def check_representation(x: np.ndarray, representation: str, field: str) -> None:
    """``sqrt`` is for non-negative features (histograms such as SURF bags of words): on a
    table with negative values it would zero them silently; refuse, naming the field."""
    if representation == "sqrt" and x.size and float(np.min(x)) < 0:
        from dpda.errors import ConfigError

        j = int(np.argmin(np.min(x, axis=0)))
        raise ConfigError(
            f"{field}: 'sqrt' needs non-negative features, but feature {j} has negative values "
            "(use 'raw', 'rownorm' or 'l2')"
        )


def per_row(x: np.ndarray, representation: str) -> np.ndarray:
    """The DP-clean per-row part of a representation."""
    if representation == "sqrt":
        return np.sqrt(row_normalize(np.maximum(x, 0)))
    if representation == "rownorm":
        return row_normalize(x)
    if representation == "l2":
        return l2_normalize(x)
    if representation == "raw":
        return x.astype(np.float64)
    raise ValueError(f"unknown representation {representation!r}")


# per-row representations whose rows are non-negative for every input: ``sqrt`` is
# √(max(x, 0) / Σ max(x, 0)); their source-space releases ask for ``nonnegative_rows`` (the
# source's clamp at 0 is then a no-op, and the same-label bound √2·C)
NONNEGATIVE_REPRESENTATIONS = frozenset({"sqrt"})

DEFAULT_REPRESENTATION = {"office-caltech": "sqrt", "mnist-usps": "l2", "synthetic": "raw"}
# How the target scales its own columns (and so the scale the source's rows are expressed in).
DEFAULT_SCALING = {"office-caltech": "zscore", "mnist-usps": "uniform", "synthetic": "zscore"}


def default_attribute_bound(representation: str, n_features: int) -> float:
    """The attribute bound b (policy ``attribute_bound``) the benchmarks and the rehearsal use,
    in the source's per-row representation: a public rule, no statistic of any data.

    ``sqrt`` and ``l2`` rows have unit L2 norm, so b = 1/√k is the root-mean-square magnitude of
    one coordinate (Office-Caltech: 0.035, close to the mean column std 0.031 of the √-counts;
    digits: 0.0625). ``rownorm`` rows sum to one: the same rule is used. ``raw``: b = 1 (the
    synthetic generator's unit scale). Note what the unit means for Office-Caltech: a +1 on one
    raw SURF count moves many √-normalized coordinates at once (the row's sum changes), so b
    protects one *representation* coordinate, not one raw count.
    """
    if representation in ("sqrt", "l2", "rownorm"):
        return 1.0 / float(np.sqrt(n_features))
    return 1.0


PUBLIC_SPACE_DIM = 20  # the public source's top principal directions the discrepancy uses
PUBLIC_SPACE_QUANTILE = 0.9  # the scale: this quantile of the public rows' norms becomes 1


@dataclass(frozen=True)
class PublicSpace:
    """The public-source setting's shared space, computed from the *public* labeled rows
    alone: per-row representation, their column scaling, their top principal directions, and a
    scale that puts the ``PUBLIC_SPACE_QUANTILE`` of their norms at 1. The data holder maps its
    private rows with the same ``map`` and clips them to norm 1."""

    representation: str
    scaling: Scaling
    basis: np.ndarray  # (k, ℓ)
    scale: float

    @classmethod
    def of(
        cls, x: np.ndarray, representation: str, scaling_mode: str, dim: int = PUBLIC_SPACE_DIM
    ) -> PublicSpace:
        xs = per_row(x, representation)
        scaling = Scaling.of(xs, scaling_mode)
        xs = scaling.apply(xs)
        _, _, vt = np.linalg.svd(xs - xs.mean(axis=0), full_matrices=False)
        basis = np.ascontiguousarray(vt[: min(dim, vt.shape[0])].T)
        norms = np.linalg.norm(xs @ basis, axis=1)
        scale = float(np.quantile(norms, PUBLIC_SPACE_QUANTILE))
        return cls(representation, scaling, basis, scale if scale > 0 else 1.0)

    def map(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(
            self.scaling.apply(per_row(x, self.representation)) @ self.basis / self.scale
        )
