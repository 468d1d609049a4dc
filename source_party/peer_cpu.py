"""A CPU-time budget per peer for the work a peer sizes: its PATE teachers and votes, its
planned-terms hints. Each peer may use ``seconds`` of CPU in any ``window_s`` window (a sliding
sum of what its requests used, measured as the CPU time of the thread that did the work); a
request that finds its peer over budget is refused with ``Overloaded`` before any work, charge
or noise. Honest peers' work is small against the budget; a peer that asks for as much as the
terms allow runs out of it and waits, instead of taking the source's cores from the others.

Each peer's heavy work also runs one request at a time (``spend`` takes the peer's own gate):
a peer that sends many requests at once gets one share of the cores, the same as a peer that
sends one, and each of its requests is checked against the budget only once its earlier work is
counted (checked all at once, they would all pass before any was counted). At most ``queue`` of
a peer's requests wait for its gate, for at most ``wait_s`` each; past either: ``Overloaded``.
Other peers' work never waits for that gate.

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
        queue: int = 4,
        wait_s: float = 60.0,
    ) -> None:
        self.seconds = seconds
        self.window_s = window_s
        self.clock = clock
        self.cpu = cpu
        self.queue = queue
        self.wait_s = wait_s
        self._lock = threading.Lock()
        self._used: dict[str, deque[tuple[float, float]]] = {}
        self._gates: dict[str, threading.Lock] = {}  # peer → held while its work runs
        self._waiting: dict[str, int] = {}  # peer → its requests waiting for the gate

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

    def waiting(self, peer: str) -> int:
        """How many of ``peer``'s requests wait for its gate now."""
        with self._lock:
            return self._waiting.get(peer, 0)

    @contextmanager
    def spend(self, peer: str, wait: bool = True) -> Iterator[None]:
        """Take ``peer``'s gate (waiting behind its earlier work; at once or ``Overloaded``
        when not ``wait``), check its budget, then count the CPU time of the block against
        it."""
        self.check(peer)  # before queueing: a peer over budget does not take a place
        gate = self._enter(peer, wait)
        try:
            self.check(peer)  # again: its earlier work is counted now
            t0 = self.cpu()
            try:
                yield
            finally:
                self.add(peer, self.cpu() - t0)
        finally:
            gate.release()

    def _enter(self, peer: str, wait: bool) -> threading.Lock:
        with self._lock:
            gate = self._gates.setdefault(peer, threading.Lock())
            if gate.acquire(blocking=False):
                return gate
            if not wait:
                raise Overloaded("the peer's earlier work still runs")
            if self._waiting.get(peer, 0) >= self.queue:
                raise Overloaded(f"the peer has {self.queue} requests waiting for its work")
            self._waiting[peer] = self._waiting.get(peer, 0) + 1
        try:
            got = gate.acquire(timeout=self.wait_s)
        finally:
            with self._lock:
                self._waiting[peer] -= 1
        if not got:
            raise Overloaded("the peer's earlier work still runs")
        return gate
