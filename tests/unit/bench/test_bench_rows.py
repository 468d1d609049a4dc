"""``dpda bench scale --rows``: the rehearsal and the job measured as the rows grow."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpda.cli.main import main
from tests.bench.rows import COLUMNS, growth, synthetic_tables


def test_the_tables_have_ten_classes_64_columns_and_a_shifted_target() -> None:
    s, t = synthetic_tables(500, seed=1)
    assert s.shape == t.shape == (500, COLUMNS + 1)
    assert set(np.unique(s[:, -1])) == set(range(10))
    ratio = t[:, :-1].std(axis=0).mean() / s[:, :-1].std(axis=0).mean()
    assert abs(float(ratio) - 1.3) < 0.05  # the target is scaled
    s2, _ = synthetic_tables(500, seed=1)
    np.testing.assert_array_equal(s, s2)


def test_growth_is_the_exponent_between_the_smallest_and_largest_rows() -> None:
    rows = [
        {"kind": "job", "rows": 10, "rc": 0, "seconds": 1.0, "peak_mb": 100.0},
        {"kind": "job", "rows": 1000, "rc": 0, "seconds": 100.0, "peak_mb": 1000.0},
        {"kind": "job", "rows": 100, "rc": 0, "seconds": 50.0, "peak_mb": 5.0},
        {"kind": "rehearsal", "rows": 10, "rc": 0, "seconds": 1.0, "peak_mb": 1.0},
        {"kind": "rehearsal", "rows": 100, "rc": 1, "seconds": 9.0, "peak_mb": 9.0},
    ]
    g = growth(rows)
    assert g["job"]["seconds_exponent"] == pytest.approx(1.0)
    assert g["job"]["peak_mb_exponent"] == pytest.approx(0.5)
    assert (g["job"]["from_rows"], g["job"]["to_rows"]) == (10, 1000)
    assert "rehearsal" not in g  # one run that finished: no growth to state


@pytest.mark.slow  # the bench end to end: 20 s
@pytest.mark.soak  # a benchmark's short run: CI runs it after the README's test command (-m soak)
def test_bench_scale_rows_smoke(tmp_path, capsys) -> None:
    out = tmp_path / "rows.json"
    argv = ["bench", "scale", "--rows", "300", "600", "--rehearsal-max", "300"]
    assert main([*argv, "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["complete"] is True
    kinds = [(r["kind"], r["rows"]) for r in data["rows"]]
    assert kinds == [("rehearsal", 300), ("job", 300), ("job", 600)]
    for r in data["rows"]:
        assert r["rc"] == 0 and r["seconds"] > 0 and r["peak_mb"] > 0
    rehearsal, job = data["rows"][0], data["rows"][1]
    assert rehearsal["references"]["ran"] is True and rehearsal["accuracy"]["otda"] is not None
    assert job["references"]["ran"] is False and job["accuracy"]["source_only"] is None
    assert "job" in data["growth"]
    assert "peak memory as N^" in capsys.readouterr().out


def test_the_source_may_have_its_own_number_of_rows() -> None:
    s, t = synthetic_tables(300, seed=2, n_source=120)
    assert s.shape == (120, COLUMNS + 1) and t.shape == (300, COLUMNS + 1)
    _, same = synthetic_tables(300, seed=2)
    np.testing.assert_array_equal(t, same)  # the target does not depend on the source's size
