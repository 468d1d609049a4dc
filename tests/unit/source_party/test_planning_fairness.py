"""Planning is fair across peers: one peer holds at most its share of the planning slots (the
rest stay free for the others), its planning CPU is counted against its own budget, and a peer
over its budget plans nothing. Clocks and CPU are injected: nothing here waits on timing."""

from __future__ import annotations

import threading

import pytest

from dpda.errors import Overloaded
from dpda.service.config import SourceLimits
from dpda.source_party.peer_cpu import PeerCpuBudget
from dpda.source_party.workers import Workers

HANG = 30  # bounds a hang only


def _workers(cpu: list[float], seconds: float = 100.0, plan_seconds: float = HANG) -> Workers:
    budget = PeerCpuBudget(seconds, 60.0, clock=lambda: 0.0, cpu=lambda: cpu[0])
    return Workers(SourceLimits(workers=64, plan_seconds=plan_seconds), budget)


def _hold(w: Workers, peer: str, n: int) -> tuple[list[threading.Thread], threading.Event]:
    """``n`` plans of ``peer`` that hold their slots until the event is set."""
    held, go = threading.Barrier(n + 1), threading.Event()

    def plan() -> None:
        with w.planning_slot(peer):
            held.wait(HANG)
            go.wait(HANG)

    threads = [threading.Thread(target=plan) for _ in range(n)]
    for t in threads:
        t.start()
    held.wait(HANG)  # every one of them holds a slot now
    return threads, go


def test_a_peer_holding_its_share_leaves_slots_for_another_peer() -> None:
    """Mallory's plans hold every slot she may take: her next one waits for one of hers to end,
    while the honest peers' plans get slots meanwhile (none refused, none waiting)."""
    w = _workers([0.0])
    share = w.peer_planning_slots
    assert share * 4 <= max(1, w.limits.workers // 4)  # a small share of the slots
    threads, go = _hold(w, "mallory", share)
    extra_in, extra_done = threading.Event(), threading.Event()

    def extra() -> None:
        with w.planning_slot("mallory"):
            extra_in.set()
        extra_done.set()

    waiting = threading.Thread(target=extra)
    waiting.start()
    try:
        for _ in range(3):  # the honest peers, one open after another, and several at once
            with w.planning_slot("honest"), w.planning_slot("other"):
                pass
        assert not extra_in.is_set()  # hers still waits behind her own plans
    finally:
        go.set()
        for t in threads:
            t.join(HANG)
    waiting.join(HANG)
    assert extra_in.is_set() and extra_done.is_set()  # her plan ran once hers had ended


def test_a_peer_whose_plans_keep_its_share_is_refused_after_plan_seconds() -> None:
    w = _workers([0.0], plan_seconds=0.01)
    threads, go = _hold(w, "mallory", w.peer_planning_slots)
    try:
        with pytest.raises(Overloaded, match="share of the slots"):
            with w.planning_slot("mallory"):
                raise AssertionError("no plan runs past the share")  # pragma: no cover
        with w.planning_slot("honest"):
            pass
    finally:
        go.set()
        for t in threads:
            t.join(HANG)


def test_planning_cpu_is_counted_against_the_planning_peer() -> None:
    cpu = [0.0]
    w = _workers(cpu, seconds=10.0)
    with w.planning_slot("mallory"):
        cpu[0] += 12.0  # one long calibration
    assert w.cpu.used("mallory") == pytest.approx(12.0)
    assert w.cpu.used("honest") == 0.0
    with pytest.raises(Overloaded, match="CPU budget"):
        with w.planning_slot("mallory"):
            raise AssertionError("no plan runs past the budget")  # pragma: no cover
    with w.planning_slot("honest"):
        cpu[0] += 1.0
    assert w.cpu.used("honest") == pytest.approx(1.0)
