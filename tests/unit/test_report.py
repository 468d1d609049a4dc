"""The job report's own SVG plots have axes with round tick values (issue 14)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dpda.target_party.report import bar_chart, line_chart, nice_ticks, scatter


@pytest.mark.parametrize(
    ("lo", "hi", "want"),
    [
        (0.0, 4.2, [0.0, 2.0, 4.0]),
        (0.0, 1.0, [0.0, 0.5, 1.0]),
        (-3.3, 2.1, [-2.0, 0.0, 2.0]),
        (0.0, 37.0, [0.0, 10.0, 20.0, 30.0]),
        (5.0, 5.0, [5.0]),
    ],
)
def test_ticks_are_round_and_inside(lo: float, hi: float, want: list[float]) -> None:
    assert nice_ticks(lo, hi) == want


def test_every_chart_draws_ticks() -> None:
    def ticks(svg: str) -> list[str]:
        return re.findall(r'font-size="10">([^<]+)</text>', svg)

    assert len(ticks(line_chart([0.5, 1.0, 1.5], 2.0, "ε"))) >= 6  # both axes
    assert {"0", "20", "40"} <= set(ticks(bar_chart([10, 40], [12, 38], "counts")))
    rng = np.random.default_rng(0)
    pts = rng.normal(size=(50, 2))
    svg = scatter(pts, np.zeros(50, int), pts + 1, np.ones(50, int), "map")
    assert len(ticks(svg)) >= 6
