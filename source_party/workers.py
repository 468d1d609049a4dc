"""Work the source does ahead or aside of a request, bounded so that no peer can tie it up:

* planning (a session's calibration) runs outside the handlers' lock, a few plans at a time,
  each under ``plan_seconds``, and fairly: a peer holds at most ``peer_planning_slots`` of the
  slots (the others stay free for the other peers), waits for a free one at most
  ``plan_seconds``, and its planning CPU counts against its ``peer_cpu_seconds``;
* a session's next charge is composed ahead (``warm``) on one worker, while the target reads
  the plan or fits the last release; its release waits for it and finds the work done;
* the terms a peer announces in ``DescribeDataset`` are planned ahead (``warm_plan``) on a
  worker of their own, so that a hint never delays or displaces a session's warm-up.

Only caches change here: a failure is the later request's to compute and report.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np

from dpda.errors import Overloaded
from dpda.protocol import TargetDisclosure
from dpda.service import responsive_io_threads
from dpda.service.config import SourceLimits
from dpda.source_party.peer_cpu import PeerCpuBudget
from dpda.source_party.releases import PreparedSession, SourceReleaser
from dpda.terms import SessionTerms

log = logging.getLogger("dpda.source")

Cap = tuple[str, float, list[Any]]


class Workers:
    def __init__(self, limits: SourceLimits, cpu: PeerCpuBudget) -> None:
        self.limits = limits
        self.cpu = cpu
        # plans (calibrations) run outside the lock, a few at a time, each under a time limit
        slots = max(1, limits.workers // 4)
        self.planning = threading.BoundedSemaphore(slots)
        # what one peer may hold of them: a small share, so another peer always finds one
        self.peer_planning_slots = max(1, slots // 4)
        self._planners: dict[str, int] = {}  # peer → the planning slots it holds now
        self._planners_turn = threading.Condition()  # a peer's plans wait here for its share
        # a new session's first release computed ahead, outside the lock (``warm``): one at a
        # time; an open that finds the worker busy is not warmed (its release does the work)
        self.warmer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpda-warm")
        self.warmer.submit(lambda: None)  # its thread started now, not inside an OpenSession
        responsive_io_threads()
        self._warm_slot = threading.BoundedSemaphore(1)
        # planned terms (``DescribeDataset``) on a worker of their own: a hint never delays or
        # displaces a session's warm-up, which its release waits for
        self.planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpda-plan-ahead")
        self._plan_slot = threading.BoundedSemaphore(1)
        self.warming: dict[str, Future[None]] = {}
        self._warm_lock = threading.Lock()  # guards ``warming``: taken last, for a dict op only

    def plan(
        self,
        releaser: SourceReleaser,
        terms: SessionTerms,
        disclosure: TargetDisclosure,
        projection: np.ndarray | None = None,
    ) -> PreparedSession:
        """Policy checks and the release plan, outside the lock, time-limited (a 10⁷-step
        calibration takes minutes: held under the lock, it stalls every release). The caller
        holds the peer's ``planning_slot``."""
        return releaser.prepare(terms, disclosure, projection, self.limits.plan_seconds)

    @contextmanager
    def planning_slot(self, peer: str) -> Iterator[None]:
        """One of the planning slots for ``peer``, its CPU time counted against the peer's
        budget. A plan of a peer that holds its share of the slots waits for one of its own
        plans to end, and one that finds every slot busy waits for any, each at most
        ``plan_seconds`` (``Overloaded`` past that): a peer's many plans queue behind each
        other, never in front of another peer's. ``Overloaded`` at once when the peer is over
        its CPU budget."""
        self.cpu.check(peer)
        with self._planners_turn:
            ok = self._planners_turn.wait_for(
                lambda: self._planners.get(peer, 0) < self.peer_planning_slots,
                timeout=self.limits.plan_seconds,
            )
            if not ok:
                raise Overloaded("the peer's earlier plans still hold its share of the slots")
            self._planners[peer] = self._planners.get(peer, 0) + 1
        try:
            self.cpu.check(peer)
            if not self.planning.acquire(timeout=self.limits.plan_seconds):
                raise Overloaded("every planning slot is busy")
            try:
                t0 = self.cpu.cpu()
                try:
                    yield
                finally:
                    self.cpu.add(peer, self.cpu.cpu() - t0)
            finally:
                self.planning.release()
        finally:
            with self._planners_turn:
                self._planners[peer] -= 1
                if not self._planners[peer]:
                    del self._planners[peer]
                self._planners_turn.notify_all()

    def warm(self, sid: str, releaser: SourceReleaser, caps: Callable[[], Cap], index: int) -> None:
        """``SourceReleaser.warm_charge`` for the session's release ``index``, in the
        background: after OpenSession, while the target reads the plan; after a release, while
        it fits that one. The release waits for it (outside the lock) and then finds its
        charge's ε composed. One warm-up at a time: an open or a release that finds one running
        is not warmed (its release does the work)."""
        if not self._warm_slot.acquire(blocking=False):
            return

        def run() -> None:
            try:
                releaser.warm_charge(sid, [caps()], index)
            except Exception:  # only caches: the release computes (and reports) for itself
                log.debug("warming session %s failed", sid, exc_info=True)
            finally:
                self._warm_slot.release()

        with self._warm_lock:
            self.warming[sid] = self.warmer.submit(run)

    def await_warm(self, sid: str) -> None:
        with self._warm_lock:
            pending = self.warming.pop(sid, None)
        if pending is not None:
            pending.result()

    def forget(self, sid: str) -> None:
        """Drop a closed session's warm-up (a running one finishes; nobody waits for it)."""
        with self._warm_lock:
            self.warming.pop(sid, None)

    def warm_plan(
        self,
        peer: str,
        name: str,
        releaser: SourceReleaser,
        terms: SessionTerms,
        caps: Callable[[], Cap],
    ) -> None:
        """``SourceReleaser.warm_plan`` in the background, while the peer computes its basis
        (on the short Office-Caltech job the first charge's composition otherwise ran between
        ``OpenSession`` and the first release: 18 ms that the release waited for, with every
        I/O thread slowed meanwhile). Bounded below a session's own warm-up: one hint at a
        time, on a worker of its own (a hint that finds it busy is dropped, so one peer's slow
        hints cost the others only their head start, never a session's warm-up); plan and
        composition under ``plan_seconds``. The caller skips a peer at its session limit,
        which could not open the session."""
        if self.cpu.used(peer) >= self.cpu.seconds:
            return  # a hint is only a head start: a peer over its CPU budget gets none
        if not self._plan_slot.acquire(blocking=False):
            return

        def run() -> None:
            try:
                peer_caps = [caps()]
                with self.cpu.spend(peer, wait=False):  # never behind the peer's work
                    releaser.warm_plan(terms, peer_caps, self.limits.plan_seconds)
            except Exception:  # only caches: OpenSession checks and reports for itself
                log.debug("planning ahead for %s failed", name, exc_info=True)
            finally:
                self._plan_slot.release()

        self.planner.submit(run)
