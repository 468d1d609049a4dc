"""The per-peer CPU budget: a sliding window of what each peer's work used, on injected clocks."""

from __future__ import annotations

import pytest

from dpda.errors import Overloaded
from dpda.source_party.peer_cpu import PeerCpuBudget


def test_a_peer_over_its_budget_is_refused_until_the_window_moves_on() -> None:
    now, cpu = [0.0], [0.0]
    budget = PeerCpuBudget(2.0, 60.0, clock=lambda: now[0], cpu=lambda: cpu[0])
    with budget.spend("mallory"):
        cpu[0] += 2.5  # one request's work
    assert budget.used("mallory") == pytest.approx(2.5)
    with pytest.raises(Overloaded):
        with budget.spend("mallory"):
            raise AssertionError("no work runs past the budget")  # pragma: no cover
    budget.check("honest")  # the other peers keep theirs
    now[0] = 61.0
    budget.check("mallory")  # the window moved past the work
    assert budget.used("mallory") == 0.0


HANG = 30  # bounds a hang only


def _until(pred) -> None:  # type: ignore[no-untyped-def]
    """Poll ``pred`` until it holds (bounded: a hang fails, no time is asserted)."""
    import threading

    for _ in range(30_000):
        if pred():
            return
        threading.Event().wait(0.001)
    raise AssertionError("never held")


def test_a_peers_heavy_requests_run_one_at_a_time_and_others_do_not_wait() -> None:
    """A peer's second request waits for its first; a third past the queue is refused at
    once; another peer's work runs meanwhile."""
    import threading

    budget = PeerCpuBudget(100.0, 60.0, queue=1, wait_s=HANG, cpu=lambda: 0.0)
    entered, go = threading.Event(), threading.Event()
    order: list[str] = []

    def first() -> None:
        with budget.spend("mallory"):
            entered.set()
            go.wait(HANG)
            order.append("first")

    def second() -> None:
        with budget.spend("mallory"):
            order.append("second")

    a = threading.Thread(target=first)
    a.start()
    assert entered.wait(HANG)
    b = threading.Thread(target=second)
    b.start()
    _until(lambda: budget.waiting("mallory") == 1)  # the second is queued behind the first
    with pytest.raises(Overloaded, match="waiting"):
        with budget.spend("mallory"):
            raise AssertionError("the queue is full")  # pragma: no cover
    with pytest.raises(Overloaded, match="still runs"):
        with budget.spend("mallory", wait=False):
            raise AssertionError("a hint never waits")  # pragma: no cover
    with budget.spend("honest"):
        order.append("honest")  # not behind mallory's work
    go.set()
    a.join(HANG)
    b.join(HANG)
    assert order == ["honest", "first", "second"] and budget.waiting("mallory") == 0


def test_a_queued_request_is_checked_against_what_the_earlier_one_used() -> None:
    """Checked only before queueing, concurrent requests all passed before any was counted."""
    import threading

    cpu = [0.0]
    budget = PeerCpuBudget(2.0, 60.0, queue=2, wait_s=HANG, cpu=lambda: cpu[0])
    entered, go = threading.Event(), threading.Event()
    ran: list[str] = []
    refused: list[BaseException] = []

    def first() -> None:
        with budget.spend("mallory"):
            entered.set()
            go.wait(HANG)
            cpu[0] += 5.0  # its work used the budget

    def second() -> None:
        try:
            with budget.spend("mallory"):
                ran.append("second")  # pragma: no cover
        except Overloaded as exc:
            refused.append(exc)

    a = threading.Thread(target=first)
    a.start()
    assert entered.wait(HANG)
    b = threading.Thread(target=second)
    b.start()
    _until(lambda: budget.waiting("mallory") == 1)
    go.set()
    a.join(HANG)
    b.join(HANG)
    assert ran == [] and len(refused) == 1 and "budget" in str(refused[0])


def test_a_request_that_waits_too_long_is_refused() -> None:
    import threading

    budget = PeerCpuBudget(100.0, 60.0, queue=1, wait_s=0.0, cpu=lambda: 0.0)
    entered, go = threading.Event(), threading.Event()

    def first() -> None:
        with budget.spend("mallory"):
            entered.set()
            go.wait(HANG)

    a = threading.Thread(target=first)
    a.start()
    try:
        assert entered.wait(HANG)
        with pytest.raises(Overloaded, match="still runs"):
            with budget.spend("mallory"):
                raise AssertionError("it did not wait its turn")  # pragma: no cover
    finally:
        go.set()
        a.join(HANG)
    assert budget.waiting("mallory") == 0
