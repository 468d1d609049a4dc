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
