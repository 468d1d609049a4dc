"""Columns are matched by their header names, never by position: a target file with the source's
header in another order gives the same predictions; a renamed column is refused, naming it; a
source with one class is refused before anything runs."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from dpda.cli.main import main
from dpda.data.synthetic import two_domains

SIMULATE = ["simulate", "--label-column", "label", "--id-column", "row_id", "--seed", "0"]


def _write(path: Path, x: np.ndarray, y: np.ndarray | None, names: list[str]) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["row_id", *names, *(["label"] if y is not None else [])])
        for i, row in enumerate(x):
            w.writerow([f"r{i}", *row.tolist(), *([int(y[i])] if y is not None else [])])


def _predictions(path: Path) -> list[tuple[str, str]]:
    with open(path, newline="") as fh:
        return [(r["id"], r["prediction"]) for r in csv.DictReader(fh)]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    s, t = two_domains(240, 120)
    names = [f"f{j}" for j in range(s.x.shape[1])]
    _write(tmp_path / "S.csv", s.x, s.labels(), names)
    _write(tmp_path / "T.csv", t.x, None, names)
    order = list(reversed(range(len(names))))
    _write(tmp_path / "T_reordered.csv", t.x[:, order], None, [names[j] for j in order])
    renamed = [*names[:-1], "f_last"]
    _write(tmp_path / "T_renamed.csv", t.x, None, renamed)
    _write(tmp_path / "S_one_class.csv", s.x, np.full(s.x.shape[0], 3), names)
    return tmp_path


def _simulate(d: Path, source: str, target: str, out: str) -> int:
    return main([
        *SIMULATE, "--source-file", str(d / source), "--target-file", str(d / target),
        "--json", str(d / f"{out}.json"), "--predictions", str(d / f"{out}.csv"),
    ])  # fmt: skip


def test_reordered_target_columns_give_the_same_predictions(files: Path) -> None:
    assert _simulate(files, "S.csv", "T.csv", "original") == 0
    assert _simulate(files, "S.csv", "T_reordered.csv", "reordered") == 0
    original = _predictions(files / "original.csv")
    assert len(original) == 120
    assert _predictions(files / "reordered.csv") == original


def test_a_renamed_column_is_refused_naming_it(files: Path, capsys) -> None:
    assert _simulate(files, "S.csv", "T_renamed.csv", "renamed") != 0
    err = capsys.readouterr().err
    assert "T_renamed.csv" in err and "'f_last'" in err and "'f39'" in err
    assert not (files / "renamed.csv").exists()  # nothing was written


def test_a_source_with_one_class_is_refused(files: Path, capsys) -> None:
    assert _simulate(files, "S_one_class.csv", "T.csv", "one") != 0
    err = capsys.readouterr().err
    assert "S_one_class.csv" in err and "'label'" in err and "one class (3)" in err
    assert not (files / "one.csv").exists() and not (files / "one.json").exists()
