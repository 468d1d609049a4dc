"""The delays of every retry loop: exponential, capped, with jitter.

Many clients that lost one server at once and retried on the same schedule would reach it again
at once; each delay is therefore drawn from the upper half of its exponential step
(``step · U[0.5, 1)``), so retries spread out while none waits less than half its step. The
caller keeps its own deadline: it asks for the next delay, and gives up when sleeping it would
pass the deadline.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator

FIRST_S = 0.2  # the first step
CAP_S = 5.0  # no step is longer


def backoff(
    first: float = FIRST_S, cap: float = CAP_S, uniform: Callable[[], float] = random.random
) -> Iterator[float]:
    """Delays in seconds for attempts 1, 2, …: step ``first``, doubled after each attempt up to
    ``cap``, each delay ``step · (0.5 + 0.5·u)`` with ``u = uniform()`` in [0, 1)."""
    if not (0 < first <= cap):
        raise ValueError(f"backoff: need 0 < first ≤ cap, got first={first}, cap={cap}")
    step = first
    while True:
        yield step * (0.5 + 0.5 * uniform())
        step = min(step * 2, cap)
