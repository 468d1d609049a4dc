"""A CPU-time budget per peer for the work a peer sizes: its PATE teachers and votes, its
planned-terms hints. Each peer may use ``seconds`` of CPU in any ``window_s`` window (a sliding
sum of what its requests used, measured as the CPU time of the thread that did the work); a
request that finds its peer over budget is refused with ``Overloaded`` before any work, charge
or noise. Honest peers' work is small against the budget; a peer that asks for as much as the
terms allow runs out of it and waits, instead of taking the source's cores from the others.

The clock is injected (``clock``: monotonic seconds), so tests do not wait for the window.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dpda.errors import Overloaded


class PeerCpuBudget:
    def __init__(
        self,
        seconds: float,
        window_s: float,
        clock: Callable[[], float] = time.monotonic,
        cpu: Callable[[], float] = time.thread_time,
    ) -> None:
        self.seconds = seconds
        self.window_s = window_s
        self.clock = clock
        self.cpu = cpu
        self._lock = threading.Lock()
        self._used: dict[str, deque[tuple[float, float]]] = {}

    def used(self, peer: str) -> float:
        """CPU seconds ``peer`` used in the current window."""
        with self._lock:
            return self._sum(peer)

    def _sum(self, peer: str) -> float:
        spent = self._used.get(peer)
        if not spent:
            return 0.0
        floor = self.clock() - self.window_s
        while spent and spent[0][0] < floor:
            spent.popleft()
        return sum(s for _, s in spent)

    def check(self, peer: str) -> None:
        """``Overloaded`` when ``peer`` has used its budget in the current window."""
        with self._lock:
            if self._sum(peer) >= self.seconds:
                raise Overloaded("the peer's CPU budget for this window is used up")

    def add(self, peer: str, seconds: float) -> None:
        with self._lock:
            self._used.setdefault(peer, deque()).append((self.clock(), max(0.0, seconds)))

    @contextmanager
    def spend(self, peer: str) -> Iterator[None]:
        """Check ``peer``'s budget, then count the CPU time of the block against it."""
        self.check(peer)
        t0 = self.cpu()
        try:
            yield
        finally:
            self.add(peer, self.cpu() - t0)
