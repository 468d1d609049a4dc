"""The source's column standardization and row bound, learned from its own rows under DP.

Raw tables come with columns of any scale (a table of measurements: 0.001 next to 4,000). A
release in the source's own space clips rows to a norm C and adds isotropic noise; before it,
the source standardizes its columns and picks C from its rows, privately, from a declared share
of the session's ε (terms ``preprocessing_share``, bounded by the policy). Both parts form one
mechanism, one ledger entry per session (``PreprocessingSpec``), charged before its noise is
drawn; every later release of the session is then a function of its rows *and* of these noisy
statistics (adaptive composition, accounted by the ledger like any other pair of events).

Relation: replace one record (add/remove: every sensitivity below divides by √2). Every value
goes through ``finite_rows`` first (a row with a NaN or ±inf is the zero row): a per-row map.

1. **Column histograms.** Each column's values fall in the bins of one fixed PUBLIC
   symmetric-log grid (``GRID``: 0, then ±10^(k/2) from 10^-6 to 10^12; values beyond fall in
   the end bins), one histogram per column, all d of them released together with Gaussian
   noise. Replacing a record moves, in each column, one count down and one up (or none):
   ``‖ΔH‖₂² ≤ 2d``, L2 sensitivity **√(2d)** (add/remove: √d). Noise ``N(0, (σ_c·√(2d))²)`` on
   every one of the d × B counts.
2. **Row norms.** The rows standardized with (1)'s statistics — post-processing of (1), so a
   public map for this step — have their L2 norms counted on a fixed PUBLIC geometric grid
   (``NORM_GRID``: 2^(k/4)). One record moves one count down and one up: sensitivity **√2**
   (add/remove 1). Noise ``N(0, (σ_n·√2)²)`` per count.

Accounting. ``Composed(Gaussian(σ_c), Gaussian(σ_n))`` — the sensitivities are folded into the
noise, as for every event of the ledger; the second query is chosen after the first (adaptive),
which the composition of Gaussians covers exactly (it is one Gaussian of multiplier
``(σ_c⁻² + σ_n⁻²)^(-1/2)``). ``σ_c`` and ``σ_n`` split that Gaussian's μ² as ``NORM_SHARE``.

Post-processing (no budget). Per column: counts below ``COLUMN_THRESHOLD`` noise standard
deviations are set to 0, and pooled counts below ``POOLED_THRESHOLD`` (the noise alone rarely
reaches that in any of the B bins); the median and the
quartiles are read off the rest, interpolated linearly inside a bin; the scale
is the larger of IQR/1.349 and 1.2533 × the mean absolute deviation from the median (both are σ
for a normal column; the second stays positive for sparse columns whose quartiles are all 0),
floored at ``SCALE_FLOOR`` × the column's own median magnitude (a column centred at 0:
× the median column scale) and at ``ABSOLUTE_FLOOR``. Only where the
columns' extents spread widely (``SPREAD_RULE`` between the first and last decile column: a
table of mixed units) does each column keep
its own scale; otherwise every column takes their root mean square (features in one unit:
pixels, term frequencies), as the target's ``uniform`` scaling does. C is the
``NORM_QUANTILE`` quantile of the thresholded norm counts, and the rows it clips are estimated
from the same counts; where those counts hold less than half the rows the column counts hold
(few rows, small ε), C is √d, the norm of a row with every standardized coordinate at 1. Where
fewer than ``MIN_KNOWN`` of the columns clear their noise at all, the statistics are the
identity and C = 1: the rows as a session without preprocessing releases them.
Nothing here reads a row again.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from dp_accounting import dp_event

from dpda.dp.mechanisms import Neighbouring, finite_rows, gaussian_noise

#: public symmetric-log grid of bin edges for every column (2 bins per decade, 1e-6 … 1e12)
_POS = 10.0 ** (np.arange(-12, 25) / 2.0)
GRID: np.ndarray = np.concatenate([-_POS[::-1], _POS])
#: public geometric grid of bin edges for the standardized rows' norms (4 bins per octave)
NORM_GRID: np.ndarray = 2.0 ** (np.arange(-24, 81) / 4.0)
NORM_SHARE = 0.2  # the norms' share of the preprocessing Gaussian's μ²
NORM_QUANTILE = 0.9  # C: this quantile of the standardized rows' norms
NORM_WINDOW = 16  # norms are read within 16 bins (a factor 16) of their median
THRESHOLD = 3.0  # norm counts below this many noise stds are read as 0 (read in a window)
# the pooled column counts: B = 75 bins of noise, none of them windowed, so a bar the noise
# alone clears in any of them with probability at most 75 · Q(4.5) ≈ 2.5e-4 (at 3 stds it is
# 10%, and a lone bin of noise far out in the grid then sets the one scale of every column)
POOLED_THRESHOLD = 4.5
# a column's own counts: d × B bins of noise, so a higher bar (a lone bin of noise that clears
# it would set that column's statistics)
COLUMN_THRESHOLD = 4.0
SCALE_FLOOR = 0.1  # a scale is at least this × its column's median (× the median scale at 0)
# per-column scales only where the columns' extents (their medians' magnitudes, zero medians
# left out) spread by more than this factor between the first and the last decile column;
# else one scale for every column (features that share units: pixels, term frequencies). The
# deciles, not the quartiles: a table of measurements holds a few columns in other units
# (wine: most columns between 1 and 20, one at 100 and one at 750), and those few would
# otherwise set the one scale that flattens every other column
SPREAD_RULE = 30.0
SPREAD_QUANTILES = (0.1, 0.9)
ABSOLUTE_FLOOR = 1e-6  # and at least the grid's smallest edge


@dataclass(frozen=True)
class PreprocessingSpec:
    """The preprocessing mechanism of one session: public parameters only."""

    columns_noise_multiplier: float  # σ_c, per unit of the histograms' L2 sensitivity
    norms_noise_multiplier: float  # σ_n, per unit of the norm histogram's sensitivity
    columns: int  # d
    relation: str
    share: float  # the share of the session's ε it was planned from (a record, not a charge)

    @property
    def columns_sensitivity(self) -> float:
        """√(2d) under replace-one, √d under add/remove (module docstring, part 1)."""
        factor = 2 if Neighbouring(self.relation) is Neighbouring.REPLACE_ONE else 1
        return math.sqrt(factor * self.columns)

    @property
    def norms_sensitivity(self) -> float:
        """√2 under replace-one, 1 under add/remove (module docstring, part 2)."""
        return math.sqrt(2.0) if Neighbouring(self.relation) is Neighbouring.REPLACE_ONE else 1.0

    @property
    def columns_noise_std(self) -> float:
        return self.columns_noise_multiplier * self.columns_sensitivity

    @property
    def norms_noise_std(self) -> float:
        return self.norms_noise_multiplier * self.norms_sensitivity

    def dp_event(self) -> dp_event.DpEvent:
        return dp_event.ComposedDpEvent(
            [
                dp_event.GaussianDpEvent(self.columns_noise_multiplier),
                dp_event.GaussianDpEvent(self.norms_noise_multiplier),
            ]
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def preprocessing_spec(
    sigma: float, columns: int, relation: str, share: float
) -> PreprocessingSpec:
    """The spec whose two Gaussians compose to one Gaussian of multiplier ``sigma`` (rounded
    toward more noise), the norms taking ``NORM_SHARE`` of its μ²."""
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError("preprocessing noise multiplier must be a finite number > 0")
    if columns < 1:
        raise ValueError("preprocessing needs at least one column")
    up = 1 + 1e-12
    return PreprocessingSpec(
        sigma / math.sqrt(1.0 - NORM_SHARE) * up,
        sigma / math.sqrt(NORM_SHARE) * up,
        columns,
        str(Neighbouring(relation).value),
        share,
    )


@dataclass(frozen=True)
class Standardization:
    """Per-column location and scale and a row bound: ``clip((x − loc) / scale, C) / C`` maps a
    row into the unit ball. The source's are DP (``fit``) and come with its release, so that
    the target maps its own rows with them too; before that, the target plans with its own
    exact ones (``exact_standardization``), of the same robust kind."""

    loc: np.ndarray  # (d,)
    scale: np.ndarray  # (d,) > 0
    clip_norm: float  # C, in standardized units
    clipped_rows: float  # rows whose norm exceeds C (the source's: a DP estimate)
    rows: float  # rows counted (the source's: a DP estimate)

    def standardized(self, x: np.ndarray) -> np.ndarray:
        """``(x − loc) / scale`` of finite rows (a non-finite row is the zero row first)."""
        with np.errstate(over="ignore", invalid="ignore"):
            z = (finite_rows(np.asarray(x, dtype=np.float64)) - self.loc) / self.scale
        return finite_rows(z)

    def apply(self, x: np.ndarray) -> np.ndarray:
        """Rows standardized, clipped to C and divided by it: every row in the unit ball (a
        per-row map, computed a block of rows at a time into one new array)."""
        from dpda.data.preprocessing import by_row_blocks
        from dpda.dp.mechanisms import clip_rows

        def unit(part: np.ndarray) -> np.ndarray:
            with np.errstate(over="ignore"):  # (see ``norm_histogram``)
                out = clip_rows(self.standardized(part), self.clip_norm)
                out /= self.clip_norm
                return out

        return by_row_blocks(np.asarray(x), unit)

    def summary(self) -> dict[str, Any]:
        """What a report says of it (no row, only the statistics themselves)."""
        return {
            "columns": int(self.loc.size),
            "location_median": float(np.median(self.loc)) if self.loc.size else 0.0,
            "scale_min": float(np.min(self.scale)) if self.scale.size else 0.0,
            "scale_median": float(np.median(self.scale)) if self.scale.size else 0.0,
            "scale_max": float(np.max(self.scale)) if self.scale.size else 0.0,
            "clip_norm": self.clip_norm,
            # None: the norms' counts were below their noise, and C the public fallback √d
            "rows_clipped_estimate": (
                None if math.isnan(self.clipped_rows) else round(self.clipped_rows, 1)
            ),
            "rows_estimate": round(self.rows, 1),
        }


def column_histograms(x: np.ndarray) -> np.ndarray:
    """Exact per-column counts on ``GRID`` (d, B): private, leaves only with noise."""
    x = finite_rows(np.asarray(x, dtype=np.float64))
    bins = np.searchsorted(GRID, x, side="right")  # 0 … len(GRID): one bin per value
    d, b = x.shape[1], GRID.size + 1
    out = np.zeros((d, b))
    for j in range(d):
        out[j] = np.bincount(bins[:, j], minlength=b)
    return out


def norm_histogram(z: np.ndarray) -> np.ndarray:
    """Exact counts of the rows' norms on ``NORM_GRID``: private, leaves only with noise."""
    from dpda.dp.mechanisms import clip_rows

    z = finite_rows(z)
    # norms without overflow: clip to the grid's top first (a per-row map)
    with np.errstate(over="ignore"):  # a row near 1e308: its ‖x‖ > C test overflows to inf
        norms = np.linalg.norm(clip_rows(z, float(NORM_GRID[-1]) * 2), axis=1)
    return np.bincount(
        np.searchsorted(NORM_GRID, norms, side="right"), minlength=NORM_GRID.size + 1
    )


def _edges_of(grid: np.ndarray, floor: float) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper edges of each bin of ``grid`` (end bins closed at ±10× the end)."""
    lo = np.concatenate([[grid[0] * 10 if grid[0] < 0 else floor], grid])
    hi = np.concatenate([grid, [grid[-1] * 10]])
    return lo, hi


def _quantiles(counts: np.ndarray, lo: np.ndarray, hi: np.ndarray, qs: list[float]) -> list[float]:
    """Quantiles of a histogram, linear inside a bin (counts ≥ 0, not all 0)."""
    cdf = np.cumsum(counts)
    total = cdf[-1]
    out = []
    for q in qs:
        i = int(np.searchsorted(cdf, q * total, side="left"))
        i = min(i, counts.size - 1)
        before = cdf[i] - counts[i]
        frac = 0.0 if counts[i] <= 0 else (q * total - before) / counts[i]
        out.append(float(lo[i] + min(max(frac, 0.0), 1.0) * (hi[i] - lo[i])))
    return out


def _spread(c: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> tuple[float, float, float]:
    """(median, scale, extent) of one histogram's counts ``c`` (≥ 0, not all 0); the extent is
    the median's magnitude (0 for a median in the bin around 0), the scale the larger of
    IQR/1.349 and 1.2533 × the mean absolute deviation from the median with every bin's centre
    brought into the 1%–99% quantile range (a far bin of little mass cannot blow it up)."""
    q01, q25, q50, q75, q99 = _quantiles(c, lo, hi, [0.01, 0.25, 0.5, 0.75, 0.99])
    centers = np.clip((lo + hi) / 2, q01, q99)
    mad = float(np.sum(c * np.abs(centers - q50)) / np.sum(c))
    extent = abs(q50) if abs(q50) >= float(_POS[0]) else 0.0
    return q50, max((q75 - q25) / 1.349, 1.2533 * mad), extent


KNOWN_SHARE = 0.5  # a column is read from its own counts when this share of rows clears noise
MIN_KNOWN = 0.25  # and per-column scales need at least this share of columns read


def read_columns(hist: np.ndarray, noise_std: float) -> tuple[np.ndarray, np.ndarray, float]:
    """(location, scale) per column from (noisy or exact) histograms (d, B), and the share of
    columns whose own counts cleared the noise: post-processing.

    A column none of whose counts clears the threshold takes the median of the others'
    locations and scales. Features in one unit (``mixed_units`` false) share one scale, read
    off the histogram of all columns pooled (the sum of the d noisy histograms: its noise grows
    as √d, its counts as d)."""
    lo, hi = _edges_of(GRID, -ABSOLUTE_FLOOR)  # the bin around 0 is [−1e-6, 1e-6)
    d = hist.shape[0]
    kept = np.where(hist >= COLUMN_THRESHOLD * noise_std, np.maximum(hist, 0.0), 0.0)
    loc, spread, extent = np.zeros(d), np.zeros(d), np.zeros(d)
    known = np.zeros(d, dtype=bool)
    pooled = hist.sum(axis=0)
    bar = POOLED_THRESHOLD * noise_std * np.sqrt(d)
    pooled = np.where(pooled >= bar, np.maximum(pooled, 0.0), 0.0)
    rows = float(np.sum(pooled)) / d  # the rows, as the pooled counts estimate them
    for j in range(d):
        c = kept[j]
        # a column is read only where at least half the typical count clears the noise (a
        # lone bin of noise that clears it carries far less)
        if np.sum(c) > 0 and np.sum(c) >= KNOWN_SHARE * rows:  # (rows > 0: the sum is)
            known[j] = True
            loc[j], spread[j], extent[j] = _spread(c, lo, hi)
    if not np.any(pooled > 0):  # nothing clears the noise: the identity scaling
        return np.zeros(d), np.ones(d), 0.0
    p_loc, p_scale, _ = _spread(pooled, lo, hi)
    if not np.any(known):
        return np.full(d, p_loc), np.full(d, max(p_scale, ABSOLUTE_FLOOR)), 0.0
    loc[~known] = float(np.median(loc[known]))
    if np.mean(known) < MIN_KNOWN or not mixed_units(extent[known]):
        # too few columns clear the noise to tell units apart (those that do may be a lone bin
        # of noise each), or the columns share a unit
        # one unit: each column's location within a few pooled scales of the pooled one
        near = np.clip(loc, p_loc - 3 * p_scale, p_loc + 3 * p_scale)
        return near, np.full(d, max(p_scale, ABSOLUTE_FLOOR)), float(np.mean(known))
    spread[~known] = float(np.median(spread[known]))
    # a column centred away from 0 keeps at least SCALE_FLOOR of its own magnitude; one
    # centred at 0 (constant or sparse) at least SCALE_FLOOR × the median column scale
    floor = np.where(extent > 0, SCALE_FLOOR * np.abs(loc), SCALE_FLOOR * float(np.median(spread)))
    return loc, np.maximum(spread, np.maximum(floor, ABSOLUTE_FLOOR)), float(np.mean(known))


def mixed_units(extent: np.ndarray) -> bool:
    """Whether the columns' extents spread by more than ``SPREAD_RULE`` between the
    ``SPREAD_QUANTILES`` columns (post-processing)."""
    live = extent[extent > 0]
    if live.size < 2:
        return False
    lo, hi = np.quantile(live, SPREAD_QUANTILES)
    return bool(hi > SPREAD_RULE * lo)


def read_norms(hist: np.ndarray, noise_std: float) -> tuple[float, float, float]:
    """(C, rows above C, rows) from (noisy or exact) norm counts: post-processing."""
    lo, hi = _edges_of(NORM_GRID, 0.0)
    kept = np.where(hist >= THRESHOLD * noise_std, np.maximum(hist, 0.0), 0.0)
    if not np.any(kept > 0):
        kept = (hist >= hist.max()).astype(np.float64)
    # only the bins within NORM_WINDOW of the median's count (a far bin of noise alone that
    # clears the threshold would otherwise set C)
    (mid,) = _quantiles(kept, lo, hi, [0.5])
    m = int(np.searchsorted(NORM_GRID, mid, side="right"))
    near = np.zeros(kept.size, dtype=bool)
    near[max(0, m - NORM_WINDOW) : m + NORM_WINDOW + 1] = True
    kept = np.where(near, kept, 0.0)
    (c,) = _quantiles(kept, lo, hi, [NORM_QUANTILE])
    c = max(c, float(NORM_GRID[0]))
    i = int(np.searchsorted(NORM_GRID, c, side="right"))
    inside = (hi[i] - c) / (hi[i] - lo[i]) if hi[i] > lo[i] else 0.0
    above = float(np.sum(kept[i + 1 :]) + kept[i] * inside)
    return c, above, float(np.sum(kept))


def noisy_columns(x: np.ndarray, spec: PreprocessingSpec, rng: np.random.Generator) -> np.ndarray:
    """Part 1 of the mechanism: the column histograms with ``N(0, (σ_c·√(2d))²)`` noise."""
    h = column_histograms(x)
    return np.asarray(h + gaussian_noise(h.shape, spec.columns_noise_std, rng))


def noisy_norms(z: np.ndarray, spec: PreprocessingSpec, rng: np.random.Generator) -> np.ndarray:
    """Part 2: the norm histogram of rows ``z`` (standardized by part 1's output) with
    ``N(0, (σ_n·√2)²)`` noise."""
    n = norm_histogram(z).astype(np.float64)
    return np.asarray(n + gaussian_noise(n.shape, spec.norms_noise_std, rng))


def fit(x: np.ndarray, spec: PreprocessingSpec, rng: np.random.Generator) -> Standardization:
    """The source's DP standardization: the two noisy histograms of the spec (its charge must
    be durable before this is called), then post-processing only."""
    x = finite_rows(np.asarray(x, dtype=np.float64))
    if x.shape[1] != spec.columns:
        raise ValueError("the rows do not have the spec's number of columns")
    h = noisy_columns(x, spec, rng)
    loc, scale, share = read_columns(h, spec.columns_noise_std)
    partial = Standardization(loc, scale, 1.0, 0.0, 0.0)
    n = noisy_norms(partial.standardized(x), spec, rng)
    c, above, rows = read_norms(n, spec.norms_noise_std)
    d = x.shape[1]
    pooled = h.sum(axis=0)
    bar = POOLED_THRESHOLD * spec.columns_noise_std * np.sqrt(d)
    counted = float(np.sum(pooled[pooled >= bar])) / d
    if share < MIN_KNOWN:
        # too few columns' counts clear their noise (few rows, small ε) to standardize by: the
        # identity and C = 1, the rows as a session without preprocessing releases them
        return Standardization(np.zeros(d), np.ones(d), 1.0, float("nan"), counted)
    if rows < KNOWN_SHARE * counted or not plausible_bound(c, d):
        # the norms' counts are mostly below their noise (few rows, small ε), or they set C
        # where no standardized table's rows lie: C is the norm of a row with every
        # standardized coordinate at 1, a public rule, and nothing is estimated of the rows
        # it clips
        return Standardization(loc, scale, float(np.sqrt(d)), float("nan"), counted)
    return Standardization(loc, scale, c, above, rows)


#: a bound read off the noisy norms is kept only within this factor of √d, the norm of a row
#: whose every standardized coordinate is 1; outside it the reading is noise (a lone count
#: of noise that cleared the threshold), not the rows
BOUND_BAND = 4.0


def plausible_bound(c: float, d: int) -> bool:
    """Whether ``c`` lies within ``BOUND_BAND`` of √d (post-processing)."""
    root = math.sqrt(d)
    return root / BOUND_BAND <= c <= root * BOUND_BAND


def exact_standardization(x: np.ndarray) -> Standardization:
    """The same statistics computed exactly: what the target uses on its own rows (nothing
    sent, no noise: its own data)."""
    x = finite_rows(np.asarray(x, dtype=np.float64))
    loc, scale, _ = read_columns(column_histograms(x), 0.0)
    partial = Standardization(loc, scale, 1.0, 0.0, 0.0)
    c, above, rows = read_norms(norm_histogram(partial.standardized(x)).astype(np.float64), 0.0)
    return Standardization(loc, scale, c, above, rows)


def standardize_rows(
    x: np.ndarray, loc: np.ndarray, scale: np.ndarray, clip_norm: float
) -> np.ndarray:
    """``Standardization.apply`` as a function of its statistics (a saved model's step)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != loc.shape[0]:
        raise ValueError(f"the model takes rows of {loc.shape[0]} features")
    return Standardization(loc, scale, clip_norm, 0.0, 0.0).apply(x)
