"""The only place that converts numpy ↔ protobuf. Validates before any work is done."""

from __future__ import annotations

import math

import numpy as np

from dpda.errors import InvalidInput
from dpda.pb import dpda_pb2 as pb

ALLOWED_DTYPES = {"<f8": np.float64, "<i8": np.int64}
MAX_ARRAY_BYTES = 256 * 1024 * 1024
MAX_MESSAGE_BYTES = MAX_ARRAY_BYTES + 1024 * 1024
# the largest request a source accepts (PATE queries, a restored ledger tail); the target splits
# larger query sets (``target_party.arms.ask_teachers``)
MAX_REQUEST_BYTES = 32 * 1024 * 1024


def to_pb(arr: np.ndarray) -> pb.NDArray:
    if arr.dtype.kind == "f":
        a = np.ascontiguousarray(arr, dtype="<f8")
    elif arr.dtype.kind in "iu":
        a = np.ascontiguousarray(arr, dtype="<i8")
    else:
        raise TypeError("only float and integer arrays travel")
    return pb.NDArray(dtype=a.dtype.str, shape=list(a.shape), data=a.tobytes())


def from_pb(
    msg: pb.NDArray,
    *,
    dtype: str | None = None,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    finite: bool = True,
    max_bytes: int = MAX_ARRAY_BYTES,
) -> np.ndarray:
    """Decode and validate; any problem raises ``InvalidInput`` without echoing values."""
    if msg.dtype not in ALLOWED_DTYPES:
        raise InvalidInput("array dtype not allowed")
    if dtype is not None and msg.dtype != dtype:
        raise InvalidInput("array dtype not allowed here")
    dims = tuple(int(d) for d in msg.shape)
    if any(d < 0 for d in dims) or len(dims) > 4:
        raise InvalidInput("array shape invalid")
    if ndim is not None and len(dims) != ndim:
        raise InvalidInput("array has the wrong number of dimensions")
    if shape is not None:
        if len(shape) != len(dims):
            raise InvalidInput("array has the wrong shape")
        if any(s is not None and s != d for s, d in zip(shape, dims, strict=True)):
            raise InvalidInput("array has the wrong shape")
    # Python integers: numpy's int64 product wraps around (2^32 × 2^32 gave 0, which matched
    # empty data and then failed to reshape), and a zero dimension must not excuse a huge other
    # one (numpy refuses to build an empty (0, 2^63 - 1) array)
    if math.prod(max(d, 1) for d in dims) * 8 > max_bytes:
        raise InvalidInput("array size does not match its shape or exceeds the limit")
    count = math.prod(dims)
    if len(msg.data) != count * 8:
        raise InvalidInput("array size does not match its shape or exceeds the limit")
    arr = np.frombuffer(msg.data, dtype=ALLOWED_DTYPES[msg.dtype]).reshape(dims)
    if finite and arr.dtype.kind == "f" and not np.all(np.isfinite(arr)):
        raise InvalidInput("array has non-finite values")
    return arr.copy()
