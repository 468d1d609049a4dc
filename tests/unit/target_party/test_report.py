"""The job report's own SVG plots have axes with round tick values (issue 14)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dpda.target_party.report import bar_chart, line_chart, nice_ticks, render, scatter


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


@pytest.mark.slow
def test_sinkhorn_synthetic_report_shows_synthetic_points_beside_the_target() -> None:
    """A sinkhorn-synthetic job's page has a 2-D plot of the released points (one cross each)
    over the target's projected rows; other releases do not get it."""
    from dpda.data.loaders import Domain
    from dpda.data.synthetic import two_domains
    from dpda.simulation import simulate
    from dpda.target_party.report import figures_of, render
    from dpda.target_party.view import AdaptConfig, target_view
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
    """The job's page says what the source spent on its records and the target on its own
    rows, this job and in all apart, or that the target's statistics went out exactly."""
    from dpda.target_party.report import render

    figs = {"batch_spend": [3.0], "budget": 4.0}
    dp = render({"epsilon_job": 3.0, "epsilon_dataset_total": 5.5, "delta": 1e-5,
                 "target_epsilon_spent": 4.0, "target_epsilon_total": 6.08,
                 "target_epsilon_cap": 8.0}, figs)  # fmt: skip
    src = dp[dp.index("the source's records") :]
    assert src.index("<td class='n'>3</td>") < src.index("<td class='n'>5.5</td>")
    tgt = dp[dp.index("the target's own rows") :]
    assert "<td class='n'>4</td><td class='n'>6.08</td><td>cap ε 8 over every job" in tgt
    exact = render({"epsilon_spent": 3.0, "delta": 1e-5, "target_epsilon_spent": None}, figs)
    assert "went out exactly" in exact
    none = render({"epsilon_spent": 3.0, "delta": 1e-5, "target_epsilon_spent": 0.0,
                   "target_disclosures": "none"}, figs)  # fmt: skip
    tgt = none[none.index("the target's own rows") :]
    assert "ε 0: nothing of them was sent" in tgt and "went out exactly" not in tgt


def test_a_job_over_several_sources_states_each_source_s_epsilon() -> None:
    """One row per source: this job's ε and the running total of each source's records, or,
    for a source that left the job, that its spend is on its own ledger and why it left."""
    from dpda.target_party.report import render

    figs = {"batch_spend": [3.0], "budget": 4.0}
    page = render({
        "delta": 1e-5, "epsilon_budget": 4.0, "target_disclosures": "none",
        "target_epsilon_spent": 0.0,
        "epsilon_spent_by_source": {"north": 3.9, "south": 7.25, "west": None},
        "epsilon_job_by_source": {"north": 3.9, "south": 3.75, "west": None},
        "consortium": {"missing": {"west": "SourceUnavailable: no answer"}},
    }, figs)  # fmt: skip
    privacy = page[page.index("<h2>Privacy</h2>") : page.index("<h2>Plots</h2>")]
    north = privacy[privacy.index("source north's records") :]
    assert north.index("<td class='n'>3.9</td>") < north.index("source south")
    south = privacy[privacy.index("source south's records") :]
    assert "<td class='n'>3.75</td><td class='n'>7.25</td>" in south
    assert "of each source" in south
    west = privacy[privacy.index("source west's records") :]
    assert "left the job" in west and "SourceUnavailable: no answer" in west
    assert "the source's records" not in privacy  # no single-source row


# what a service job's results.json holds (the numbers of the new user's report)
RESULTS = {
    "job_id": "3f2a9c0d1b7e",
    "dataset": "digits",
    "source": "source.example:50051",
    "finished_at": "2026-12-03T06:30:00+00:00",
    "accuracy": None,
    "epsilon_job": 2.536,
    "epsilon_dataset_total": 6.9188,
    "epsilon_spent": 6.9188,
    "epsilon_budget": 3.0,
    "delta": 0.00011111111111111112,
    "selection": {"reg_e": 0.1, "reg_g": 1.0},
    "target_epsilon_spent": None,
    "adaptation": {"helped": "likely", "estimate": 0.031},
}


def _figures(n_releases: int = 1) -> dict:
    rng = np.random.default_rng(0)
    pts = rng.normal(size=(60, 2))
    return {
        "batch_spend": [6.9188] * n_releases,  # the dataset's total: not what this job spent
        "job_spend": [2.536 * (i + 1) / n_releases for i in range(n_releases)],
        "budget": 3.0,
        "noisy_counts": [[88.6, 91.2, 90.1]],
        "mapped_labels": np.array([0, 1, 2]),
        "predicted_counts": [30, 20, 10],
        "target_2d": pts,
        "target_labels": np.arange(60) % 3,
        "mapped_2d": pts[:3] + 0.1,
    }


def test_the_report_reads_as_this_job_and_formats_every_number() -> None:
    from dpda.target_party.report import render

    page = render(RESULTS, _figures())
    ticks = re.findall(r'font-size="10">([^<]+)</text>', page)
    assert "-0" not in ticks and "0.5" not in ticks  # one release: whole-number releases only
    assert "job&#x27;s budget ε 3</text>" in page  # the budget line that applies, named
    assert "<title>2.5360</title>" in page and "<title>6.9188</title>" not in page  # this job's
    assert "0.00011111111111111112" not in page and "1.111e-04" in page
    assert "{'" not in page and "None" not in page
    assert "class 0" in page and "class 2" in page  # the scatter's class legend
    assert "target rows predicted as it" in page  # what the blue bars are
    for fact in ("3f2a9c0d1b7e", "digits", "source.example:50051", "2026-12-03T06:30:00"):
        assert fact in page
    assert "<h2>Adaptation</h2>" in page and "estimate 0.031" not in page  # a table of its own


def test_the_legend_wraps_so_every_class_is_inside_the_plot() -> None:
    from dpda.target_party.report import LEGEND_STEP, W, legend_swatch

    rng = np.random.default_rng(0)
    labels = np.arange(10).repeat(5)
    svg = scatter(rng.normal(size=(50, 2)), labels, np.zeros((0, 2)), labels[:0], "t")
    shown = re.findall(r'<text x="([\d.]+)" y="[\d.]+" font-size="10">class (\d+)</text>', svg)
    assert [int(c) for _, c in shown] == list(range(10))
    # each label's text (about 40 px at this size) ends inside the plot
    assert all(float(x) + 40 <= W for x, _ in shown)
    assert legend_swatch(9)[1] > legend_swatch(0)[1]  # a second row, not a cut
    assert legend_swatch(1)[0] - legend_swatch(0)[0] == LEGEND_STEP


def test_the_budget_cells_and_the_selection_read_as_what_they_are() -> None:
    from dpda.target_party.report import render

    summary = {
        "epsilon_job": 2.0,
        "epsilon_spent": 6.0,
        "epsilon_dataset_total": 6.0,
        "epsilon_budget": 2.0,
        "epsilon_dataset_cap": 8.0,
        "selection": {
            "method": "circular",
            "reg_e": 0.02,
            "reg_g": 0.5,
            "candidates": [
                {"reg_e": 0.01, "reg_g": 0.1, "score": 0.4},
                {"reg_e": 0.02, "reg_g": 0.5, "score": 0.6},
            ],
        },
    }
    page = render(summary, {"batch_spend": [2.0], "budget": 2.0})
    assert "cap ε 8 over every job; this job may spend ε 2" in page
    rows = re.findall(r"<tr><th>([^<]*running total[^<]*)</th><td>6</td></tr>", page)
    assert len(rows) == 1 and "source" in rows[0]  # named as what it is, once
    # beside this job's ε, not apart from it
    this_job = page.index("<th>ε this job</th><td>2</td>")
    assert 0 < page.index(rows[0]) - this_job < 200
    table = page[page.index("<table class='selection'>") :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 3 and table.count(">chosen<") == 1
    assert "candidates" not in page  # not one paragraph of raw candidates


def test_the_label_free_choice_is_a_table_of_its_arms_with_the_kept_one_marked() -> None:
    arms = [
        {
            "arm": f"dpda/zscore/{d}/1nn",
            "adapt": True,
            "score": s,
            "largest_share": 0.3,
            "collapsed": False,
            "accuracy": 70.0 + d,
            "scores": {"counts": 0.9},
        }
        for d, s in ((10, 0.2), (20, None))
    ] + [
        {
            "arm": "dp_no_adaptation/zscore/10/1nn",
            "adapt": False,
            "score": 0.1,
            "largest_share": 0.95,
            "collapsed": True,
            "accuracy": 50.0,
            "scores": {"counts": 0.4},
        }
    ]
    choice = {
        "criterion": "silhouette",
        "kept": arms[0]["arm"],
        "arms": arms,
        "guard": "1 arm(s) put more than 90% of the rows in one class",
        "failed": [],
    }
    summary = {"accuracy": 80.0, "adaptation": {"kept": "dpda", "choice": choice}}
    text = render(summary, {"batch_spend": [1.0], "budget": 1.0})
    table = text[text.index("<table class='choice'>") :]
    table = table[: table.index("</table>")]
    assert table.count("<tr>") == 1 + 3 and table.count(">kept<") == 1
    assert "collapse guard:</b> 1 arm(s)" in text
    assert "arm dpda/zscore" not in text  # no paragraph of raw candidates
    voted = dict(
        choice,
        rule="vote",
        kept="vote of 2 adapted arms",
        vote={"members": [arms[0]["arm"], arms[1]["arm"]], "collapsed": False},
    )
    text = render({"adaptation": {"choice": voted}}, {"batch_spend": [1.0], "budget": 1.0})
    table = text[text.index("<table class='choice'>") :]
    assert "<b>rule</b> vote" in text and "<b>kept</b> vote of 2 adapted arms" in text
    assert table.count(">votes<") == 2 and table.count(">kept<") == 0
    weighted = dict(voted, vote=dict(voted["vote"], weights=[1.0, 0.25]))
    text = render({"adaptation": {"choice": weighted}}, {"batch_spend": [1.0], "budget": 1.0})
    table = text[text.index("<table class='choice'>") :]
    assert ">votes (weight 1)<" in table and ">votes (weight 0.25)<" in table
