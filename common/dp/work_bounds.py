"""Bounds on the accounting work a thread does, and the caches that let it do less.

Privacy accounting is pure math (``dpda.dp.accounting``), but its cost is set by the numbers it
is given, and a peer chooses some of them: the steps of a session, its batch, its ε. Two
bounds hold inside the work, per thread:

* ``time_limit``: a deadline, checked before every evaluation of ε and while waiting for
  another thread's composition (``check_deadline``). The source plans a peer's session under
  it. The clock is injectable, so tests drive it without waiting.
* ``size_bound``: checked *before* each privacy-loss distribution is built
  (``check_pld_points``): a composition whose discretized support would exceed the bound is
  refused instead of run, so no single library call can take minutes or gigabytes (10⁴
  full-batch steps at σ = 1 would need ~1.5·10⁷ points). Every calibration search runs under
  ``MAX_PLD_POINTS`` and treats a refused composition as spending more than ε
  (``dpda.dp.calibration``): the bound is part of what a plan *is*, so both parties compute
  the same plan whatever their deadlines.

Both raise ``WorkLimitExceeded`` (``CalibrationTimeout`` or ``PlanTooLarge``).

The caches hold immutable results keyed by public parameters (PLDs, ε, calibrated scales), LRU,
with single flight: a thread that finds its key being made by another waits for it rather than
making it again. ``fresh_caches`` gives a block of code caches of its own (tests).
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

# A PLD of this many points per PMF is ~35 MB; the FFT that makes it needs a few times that. A
# σ that meets any ε ≤ 100 needs far fewer (a Gaussian of μ ≤ 15: < 10⁶ points on a 10⁻³ grid).
MAX_PLD_POINTS = 4_000_000
_WAIT_TICK_S = 0.05  # how often a thread waiting for another's composition checks its deadline


class WorkLimitExceeded(Exception):
    """The accounting work of this thread passed a bound set with ``time_limit``."""


class CalibrationTimeout(WorkLimitExceeded):
    """A calibration ran past the time limit set with ``time_limit``."""


class PlanTooLarge(WorkLimitExceeded):
    """A composition would need more points than the bound set with ``time_limit``."""


@dataclass
class _Bounds:
    at: float | None = None
    clock: Callable[[], float] = time.monotonic
    max_points: float = math.inf


_local = threading.local()


def _bounds() -> _Bounds:
    got = getattr(_local, "bounds", None)
    return got if got is not None else _Bounds()


@contextmanager
def _bounded(**change: Any) -> Iterator[None]:
    previous = getattr(_local, "bounds", None)
    _local.bounds = replace(_bounds(), **change)
    try:
        yield
    finally:
        _local.bounds = previous


def time_limit(
    seconds: float | None, clock: Callable[[], float] = time.monotonic
) -> AbstractContextManager[None]:
    """Bound the accounting time of this thread: past ``seconds`` (on ``clock``) every check
    raises ``CalibrationTimeout``. ``None``: no deadline (the ledger's own charges)."""
    return _bounded(at=None if seconds is None else clock() + seconds, clock=clock)


def size_bound(max_points: float = MAX_PLD_POINTS) -> AbstractContextManager[None]:
    """Refuse (``PlanTooLarge``) any composition of more than ``max_points`` points in this
    thread; nested bounds keep the smaller."""
    return _bounded(max_points=min(float(max_points), _bounds().max_points))


def check_deadline() -> None:
    """Raise ``CalibrationTimeout`` when this thread's time limit has passed."""
    b = _bounds()
    if b.at is not None and b.clock() > b.at:
        raise CalibrationTimeout("accounting time limit reached")


def check_pld_points(points: float) -> None:
    """Raise ``PlanTooLarge`` when a composition of ``points`` exceeds this thread's bound."""
    check_deadline()
    if points > _bounds().max_points:
        raise PlanTooLarge(f"a privacy-loss distribution of {points:.3g} points")


def gaussian_pld_points(
    noise_multiplier: float,
    count: int,
    interval: float,
    sampled: bool,
    sampling_rate: float = 1.0,
    revealed: bool = False,
) -> float:
    """An upper estimate of the points dp-accounting builds for ``count`` Gaussian steps of
    multiplier σ (sensitivity 1), each taken with probability ``sampling_rate`` when
    ``sampled``, on a grid of ``interval``.

    Plain Gaussians are built as one Gaussian of μ = √count/σ, whose grid spans the loss of both
    neighbours: about (20·μ + μ²)/interval points; this takes (30·μ + 1.25·μ²). Sampled steps are
    built once and self-composed: the composition keeps one step's span (30·μ + 1.25·μ² at μ = 1/σ;
    80·μ + 1.25·μ² for a revealed coin, whose mixture with the identity keeps the Gaussian's whole
    truncated span) plus the bulk of the composed loss, which spreads as √count·s, s the standard
    deviation of one step's loss: p·√(e^{μ²} − 1) (its χ² divergence) but at most μ for a Poisson
    sampled step, √(p·μ² + p(1 − p)·μ⁴/4) for a revealed one (no loss, or the Gaussian's N(μ²/2,
    μ²)). This takes the span plus 34·√count·s, all over ``interval``: above the points built for
    the shapes docs/results.md lists ("Where the constants come from").
    """
    if noise_multiplier <= 0:
        return 0.0  # not DP at all: nothing is discretized
    if not sampled:
        mu = math.sqrt(max(count, 1)) / noise_multiplier
        return (30.0 * mu + 1.25 * mu * mu) / interval
    mu = 1.0 / noise_multiplier
    p = min(max(sampling_rate, 0.0), 1.0)
    if revealed:
        spread = math.sqrt(p * mu * mu + p * (1.0 - p) * mu**4 / 4.0)
    else:
        spread = mu if mu * mu > 700 else min(mu, p * math.sqrt(math.expm1(mu * mu)))
    one_step = (80.0 if revealed else 30.0) * mu + 1.25 * mu * mu
    return (one_step + 34.0 * math.sqrt(max(count, 1)) * spread) / interval


# ---------------------------------------------------------------------------------- caches
class SingleFlightCache:
    """An LRU map of immutable values, each made once: ``get(key, make)``."""

    _lock = threading.Lock()  # one lock for every cache: keys nest across caches
    _making: dict[tuple[int, Any], threading.Event] = {}

    def __init__(self, size: int) -> None:
        self.size = size
        self._data: OrderedDict[Any, Any] = OrderedDict()

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._data

    def __len__(self) -> int:
        return len(self._data)

    def keys(self) -> set[Any]:
        with self._lock:
            return set(self._data)

    def clear(self) -> None:
        with self._lock:
            self._data.clear()

    def get(self, key: Any, make: Callable[[], Any]) -> Any:
        """``self[key]``, made by ``make`` on a miss, once: a thread that finds the same key
        being made waits for it (keeping its own time limit) rather than making it again.
        Keys nest one way only (ε → fold of a prefix → step; a fold's prefix is shorter), so
        no wait is circular. If the maker fails, a waiter makes the value itself (and meets
        the same error)."""
        slot = (id(self), key)
        while True:
            mine: threading.Event | None = None
            try:
                with self._lock:
                    if key in self._data:
                        self._data.move_to_end(key)
                        return self._data[key]
                    busy = self._making.get(slot)
                    if busy is None:
                        mine = threading.Event()
                        self._making[slot] = mine
                if busy is not None:
                    while not busy.wait(_WAIT_TICK_S):
                        check_deadline()  # a waiter keeps its own limit, not the maker's
                    continue
                value = make()
                with self._lock:
                    self._data[key] = value
                    while len(self._data) > self.size:
                        self._data.popitem(last=False)
                return value
            finally:
                # registered and cleared inside one ``try``: an exception anywhere after the
                # key is registered (KeyboardInterrupt included) frees it for its waiters
                if mine is not None:
                    with self._lock:
                        if self._making.get(slot) is mine:
                            del self._making[slot]
                    mine.set()


@dataclass
class Caches:
    """The accounting's caches: PLDs (~0.1–1 MB each) and floats."""

    step: SingleFlightCache = field(default_factory=lambda: SingleFlightCache(64))
    fold: SingleFlightCache = field(default_factory=lambda: SingleFlightCache(64))
    epsilon: SingleFlightCache = field(default_factory=lambda: SingleFlightCache(64))
    sampled: SingleFlightCache = field(default_factory=lambda: SingleFlightCache(1024))
    scale: SingleFlightCache = field(default_factory=lambda: SingleFlightCache(1024))


_current = Caches()


def caches() -> Caches:
    """The caches in use."""
    return _current


@contextmanager
def fresh_caches() -> Iterator[Caches]:
    """Empty caches for the block (every thread), the earlier ones back after it."""
    global _current
    previous, _current = _current, Caches()
    try:
        yield _current
    finally:
        _current = previous
