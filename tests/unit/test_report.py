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


def test_sinkhorn_synthetic_report_shows_synthetic_points_beside_the_target() -> None:
    """A sinkhorn-synthetic job's page has a 2-D plot of the released points (one cross each)
    over the target's projected rows; other releases do not get it."""
    from dpda.data.loaders import Domain
    from dpda.data.synthetic import two_domains
    from dpda.simulation import simulate
    from dpda.target_party.pipeline import AdaptConfig, target_view
    from dpda.target_party.report import figures_of, render
    from dpda.terms import SessionTerms

    src, tgt = two_domains()
    assert isinstance(tgt, Domain)
    terms = SessionTerms(
        dataset="synthetic",
        epsilon=4.0,
        delta=1e-4,
        projection_dim=6,
        release="sinkhorn-synthetic",
        synthetic_points=3,
    )
    res = simulate(src, tgt, terms, "raw", AdaptConfig(), seed=1, baselines=False).dpda
    view = target_view(tgt, "raw")
    figs = figures_of(res, view, 4.0, "sinkhorn-synthetic")
    assert figs["synthetic_2d"].shape == (res.source_points.shape[0], 2)
    assert figs["target_projected_2d"].shape == (tgt.x.shape[0], 2)
    page = render(res.summary(terms), figs)
    assert "released synthetic points" in page
    svg = page[page.index("synthetic points (projected space") :]
    assert svg.count("<path d=") >= res.source_points.shape[0]  # a cross per point
    assert "synthetic_2d" not in figures_of(res, view, 4.0, "prototypes")


def test_the_report_states_both_parties_epsilon() -> None:
    """Issue 19: the job's page says what the source spent on its records and the target on its
    own rows, or that the target's statistics went out exactly."""
    from dpda.target_party.report import render

    figs = {"batch_spend": [3.0], "budget": 4.0}
    dp = render({"epsilon_spent": 3.0, "delta": 1e-5, "target_epsilon_spent": 4.0,
                 "target_epsilon_total": 6.08}, figs)  # fmt: skip
    assert "the source 3.0000 on its records" in dp
    assert "the target 4.0000 on its own rows (6.0800 over every job" in dp
    exact = render({"epsilon_spent": 3.0, "delta": 1e-5, "target_epsilon_spent": None}, figs)
    assert "disclosed its statistics exactly" in exact and "on its own rows" not in exact
