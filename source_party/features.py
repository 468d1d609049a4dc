"""The source's features as its mechanisms read them: each row in its per-row representation,
then the target's public column scaling (bounded, or refused), clamped to ±CLAMP — all per-row
or elementwise maps with public parameters, so no sensitivity grows. Large arrays are computed
into memory mapped ahead (``populated_empty``)."""

from __future__ import annotations

import math
import mmap
from typing import Any

import numpy as np

from dpda.data.preprocessing import Scaling, per_row
from dpda.errors import InvalidInput, PolicyRefused
from dpda.policy import SCALING_MEAN_MAX, SCALING_STD_RANGE

# Values of the scaled per-row representation are clamped to this magnitude: an elementwise
# clamp is 1-Lipschitz per coordinate (so no sensitivity grows) and keeps every later product
# finite (ℓ, k ≤ 1e5 and |M| ≤ ~1 give |x·M| ≤ ~1e106).
CLAMP = 1e100

POPULATE_MIN_BYTES = 1 << 20  # below this, first-touch faults cost less than a mapping
# above this, np.empty: the mapping call holds the GIL while the kernel maps every page (256 MiB
# stalled the daemon's other threads for 62–75 ms, found by review); numpy's loop faults pages
# in with the GIL released
POPULATE_MAX_BYTES = 32 << 20


def check_scaling(scaling: Scaling | None, n_features: int) -> None:
    """The target's column scaling is an input to the mechanism: bounded, or refused."""
    if scaling is None:
        return
    if scaling.mean.shape != (n_features,) or scaling.std.shape != (n_features,):
        raise InvalidInput(
            f"scaling: {scaling.mean.shape[0]} and {scaling.std.shape[0]} columns, the source "
            f"has {n_features} features",
            public=True,
        )
    lo, hi = SCALING_STD_RANGE
    if not (np.all(np.isfinite(scaling.mean)) and np.all(np.abs(scaling.mean) <= SCALING_MEAN_MAX)):
        raise PolicyRefused(
            f"scaling_mean: every entry must be finite with |mean| ≤ {SCALING_MEAN_MAX:g}"
        )
    if not (np.all(np.isfinite(scaling.std)) and np.all((scaling.std >= lo) & (scaling.std <= hi))):
        raise PolicyRefused(f"scaling_std: every entry must lie in [{lo:g}, {hi:g}]")


def prepare_features(x_raw: np.ndarray, representation: str, scaling: Scaling | None) -> np.ndarray:
    """Per-row transform, then the target's public scaling, clamped to ±CLAMP (all DP-clean:
    per-row or elementwise maps with public parameters). Clipping (record unit) happens after
    the projection, on finite rows (``mechanisms.clip_rows``)."""
    return scaled_features(per_row(x_raw, representation), scaling)


def populated_empty(shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose pages the kernel maps in one call (``MAP_POPULATE``)
    rather than one fault per 4 KiB page at first touch. In a daemon a large array is fresh
    memory (a worker thread's first allocation of its size): on this project's 2-core VM the
    Office-Caltech features (7 MiB) took 1,839 page faults and 17 ms to compute against 4 ms
    from memory the allocator had already mapped (``dpda bench service`` traces). Arrays under
    ``POPULATE_MIN_BYTES`` or over ``POPULATE_MAX_BYTES``, and platforms without
    ``MAP_POPULATE``, get ``np.empty``."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    populate = getattr(mmap, "MAP_POPULATE", None)
    if not (POPULATE_MIN_BYTES <= nbytes <= POPULATE_MAX_BYTES) or populate is None:
        return np.empty(shape, dt)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate
    buf = mmap.mmap(-1, nbytes, flags=flags)  # unmapped when the array's last view goes
    return np.frombuffer(buf, dtype=dt).reshape(shape)


def scaled_features(rows: np.ndarray, scaling: Scaling | None) -> np.ndarray:
    """``prepare_features`` from rows already in their per-row representation (the part that
    needs no input from the target): a new array, ``rows`` untouched; element for element (and
    dtype for dtype) the arithmetic of ``Scaling.apply``, done in place without temporaries,
    into memory mapped ahead (``populated_empty``)."""
    if scaling is None:
        x = populated_empty(rows.shape, rows.dtype)
        np.copyto(x, rows)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            x = populated_empty(rows.shape, np.result_type(rows, scaling.mean))
            np.subtract(rows, scaling.mean, out=x)
            if np.result_type(x, scaling.std) == x.dtype:
                np.divide(x, scaling.std, out=x)
            else:
                x = x / scaling.std
    with np.errstate(over="ignore"):  # (float32 rows: ±CLAMP itself overflows to ±inf)
        np.clip(x, -CLAMP, CLAMP, out=x)  # ±inf → ±CLAMP
    return np.nan_to_num(x, nan=0.0, copy=False)
