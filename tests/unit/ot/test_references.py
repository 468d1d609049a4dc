"""The rehearsal's non-private references at bounded memory: OTDA on a stated subsample, 1-NN
by row blocks, both skipped (and said to be) where the target has no labels to score them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import dpda.simulation as sim
from dpda.data.synthetic import two_domains
from dpda.ot.references import reference_method
from dpda.target_party.view import AdaptConfig, target_view
from dpda.terms import SessionTerms


def _terms() -> SessionTerms:
    return SessionTerms(dataset="syn", epsilon=4.0, delta=1 / 720, projection_dim=5)


def test_otda_solves_on_at_most_the_subsample_and_labels_every_target_row(monkeypatch) -> None:
    s, t = two_domains(n_source=300, n_target=200, k=8, seed=3)
    view = target_view(t, "raw", scaling_mode="zscore")
    shapes: list[tuple[int, int]] = []
    solve = sim.sinkhorn_group_lasso

    def recording(a, b, cost, *args, **kw):
        shapes.append(cost.shape)
        return solve(a, b, cost, *args, **kw)

    monkeypatch.setattr(sim, "sinkhorn_group_lasso", recording)
    pred = sim.otda_predictions(s, view, "raw", AdaptConfig(), max_rows=120)
    assert shapes == [(120, 120)]
    assert pred.shape == (200,)
    # every row (0, or a cap above both sizes): the exact problem, the same predictions
    exact = sim.otda_predictions(s, view, "raw", AdaptConfig(), max_rows=0)
    above = sim.otda_predictions(s, view, "raw", AdaptConfig(), max_rows=10_000)
    assert shapes[1:] == [(300, 200), (300, 200)]
    np.testing.assert_array_equal(exact, above)


def test_the_subsample_is_uniform_and_drawn_from_the_seed() -> None:
    a = sim._subsample(1000, 100, 0, 31)
    b = sim._subsample(1000, 100, 0, 31)
    c = sim._subsample(1000, 100, 1, 31)
    assert a is not None and c is not None
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    assert a.size == np.unique(a).size == 100 and np.all(np.diff(a) > 0)
    assert sim._subsample(100, 100, 0, 31) is None and sim._subsample(100, 0, 0, 31) is None


def test_reference_method_says_which_rows_the_otda_reference_solved() -> None:
    assert "every row (2000 × 1500)" in reference_method(2000, 1500, 5000)["otda"]
    sub = reference_method(100_000, 8000, 5000)["otda"]
    assert "5000 of 100000 source" in sub and "5000 of 8000 target" in sub
    assert "every row (100000 × 8000)" in reference_method(100_000, 8000, 0)["otda"]


@pytest.mark.slow  # three whole rehearsals
@pytest.mark.parametrize("asked", [None, True, False])
def test_references_run_only_where_labels_can_score_them_unless_asked(asked, monkeypatch) -> None:
    s, t = two_domains(n_source=200, n_target=120, k=8, seed=1)
    unlabeled = dataclasses.replace(t, y=None, n_classes=0)
    calls: list[int] = []
    real = sim.best_scaling_baselines

    def counting(*args, **kw):
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(sim, "best_scaling_baselines", counting)
    out = sim.simulate(s, unlabeled, _terms(), "raw", AdaptConfig(), seed=0, baselines=asked)
    data = out.to_json(_terms())
    assert data["references"]["ran"] is bool(asked)
    assert len(calls) == int(bool(asked))
    assert data["accuracy"]["source_only"] is None and data["accuracy"]["otda"] is None
    if asked is None:
        assert "no labels" in data["references"]["why"]
    elif asked:
        assert data["baseline_scaling"] == "zscore"  # no labels to pick by
        assert "every row" in data["references"]["method"]["otda"]
    labeled = sim.simulate(s, t, _terms(), "raw", AdaptConfig(), seed=0, baselines=asked)
    ran = asked is not False
    assert labeled.to_json(_terms())["references"]["ran"] is ran
    assert (labeled.source_only is not None) is ran and (labeled.otda is not None) is ran


def test_nearest_neighbours_compare_rows_in_bounded_blocks(monkeypatch) -> None:
    import sklearn

    from dpda.ot.references import REFERENCE_MEMORY_MB

    seen: list[int] = []
    before = sklearn.get_config()["working_memory"]

    def recording(x, y, xt, kind, seed):
        seen.append(sklearn.get_config()["working_memory"])
        return None, np.zeros(xt.shape[0], dtype=int)

    monkeypatch.setattr(sim, "fit_predict", recording)
    s, t = two_domains(n_source=100, n_target=60, k=4, seed=2)
    view = target_view(t, "raw", scaling_mode="zscore")
    sim.source_only_predictions(s, view, "raw", AdaptConfig())
    sim.otda_predictions(s, view, "raw", AdaptConfig())
    assert seen == [REFERENCE_MEMORY_MB, REFERENCE_MEMORY_MB]
    assert sklearn.get_config()["working_memory"] == before  # restored after each


def test_simulate_cli_says_the_references_are_skipped_and_runs_them_when_asked(
    tmp_path, capsys
) -> None:
    import json

    import pandas as pd

    from dpda.cli.main import main

    s, t = two_domains(n_source=200, n_target=120, k=6, seed=4)
    cols = [f"f{i}" for i in range(6)]
    pd.DataFrame({**dict(zip(cols, s.x.T, strict=True)), "label": s.y}).to_csv(
        tmp_path / "S.csv", index=False
    )
    pd.DataFrame(dict(zip(cols, t.x.T, strict=True))).to_csv(tmp_path / "T.csv", index=False)
    base = ["simulate", "--source-file", str(tmp_path / "S.csv"), "--target-file",
            str(tmp_path / "T.csv"), "--label-column", "label", "--seed", "0"]  # fmt: skip
    assert main([*base, "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert "references skipped: the target has no labels" in out
    a = json.loads((tmp_path / "a.json").read_text())
    assert a["references"]["ran"] is False and a["accuracy"]["otda"] is None
    args = ["--references", "--reference-rows", "50", "--json", str(tmp_path / "b.json")]
    assert main([*base, *args]) == 0
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["references"]["ran"] is True
    assert "50 of 200 source and 50 of 120 target" in b["references"]["method"]["otda"]
    assert "uniform subsample of 50 of 200" in capsys.readouterr().out
