"""``dpda simulate --seeds N`` runs the rehearsal at N seeds and reports each arm's spread."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from dpda.cli.main import main
from dpda.cli.simulate import spread_of
from dpda.data.synthetic import two_domains


def _write(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*(f"f{j}" for j in range(x.shape[1])), "label"])
        w.writerows([*row.tolist(), int(label)] for row, label in zip(x, y, strict=True))


@pytest.fixture
def files(tmp_path: Path) -> Path:
    s, t = two_domains(240, 120, separation=2.0)
    _write(tmp_path / "S.csv", s.x, s.labels())
    _write(tmp_path / "T.csv", t.x, t.labels())  # labeled: the rehearsal scores each arm
    return tmp_path


def _simulate(d: Path, out: str, *extra: str) -> dict:
    code = main([
        "simulate", "--source-file", str(d / "S.csv"), "--target-file", str(d / "T.csv"),
        "--label-column", "label", "--json", str(d / out), *extra,
    ])  # fmt: skip
    assert code == 0
    return json.loads((d / out).read_text())


def test_seeds_adds_the_spread_of_every_arm(files: Path, capsys) -> None:
    data = _simulate(files, "three.json", "--seeds", "3", "--seed", "5")
    assert data["seeds"] == [5, 6, 7]
    arms = {k for k, v in data["accuracy"].items() if v is not None}
    assert {"dpda", "source_only", "otda"} <= arms
    assert set(data["spread"]) == arms
    for arm, st in data["spread"].items():
        runs = [acc[arm] for acc in data["accuracy_by_seed"]]
        assert st["runs"] == 3
        assert st["mean"] == pytest.approx(np.mean(runs))
        assert st["std"] == pytest.approx(np.std(runs))
        assert st["min"] <= st["mean"] <= st["max"]
    # each seed's run is the run --seed gives alone
    alone = _simulate(files, "six.json", "--seed", "6")
    assert data["accuracy_by_seed"][1] == alone["accuracy"]
    out = capsys.readouterr().out
    assert "3 seeds (5…7)" in out and "dpda" in out and "±" in out


def test_the_spread_covers_arms_it_has_never_seen() -> None:
    runs = [
        {"dpda": 80.0, "dp_no_adaptation": 70.0, "adapting_helped": None},
        {"dpda": 90.0, "dp_no_adaptation": 74.0, "adapting_helped": None},
    ]
    spread = spread_of(runs)
    assert set(spread) == {"dpda", "dp_no_adaptation"}
    assert spread["dpda"] == {"mean": 85.0, "std": 5.0, "min": 80.0, "max": 90.0, "runs": 2}
