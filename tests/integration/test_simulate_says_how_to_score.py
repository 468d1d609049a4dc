"""``dpda simulate`` says how to score, claims no choice it did not measure, and names the
flag behind an error: a user of the command line sets flags, not config fields."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from dpda.cli.main import main
from dpda.data.synthetic import two_domains


def _write(path: Path, x, y) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*(f"f{j}" for j in range(x.shape[1])), *(["label"] if y is not None else [])])
        for i, row in enumerate(x):
            w.writerow([*row.tolist(), *([int(y[i])] if y is not None else [])])


@pytest.fixture
def files(tmp_path: Path) -> Path:
    s, t = two_domains(200, 120)
    _write(tmp_path / "S.csv", s.x, s.labels())
    _write(tmp_path / "T.csv", t.x, None)  # no labels: nothing to score
    return tmp_path


def _simulate(files: Path, *flags: str) -> list[str]:
    return [
        "simulate", "--source-file", str(files / "S.csv"), "--target-file",
        str(files / "T.csv"), "--label-column", "label", "--seed", "1",
        "--predictions", str(files / "p.csv"), *flags,
    ]  # fmt: skip


@pytest.mark.slow
def test_an_unlabeled_target_claims_no_choice_and_says_how_to_score(files, capsys) -> None:
    out_json = files / "r.json"
    assert main(_simulate(files, "--json", str(out_json))) == 0
    out = capsys.readouterr().out
    assert "by the target's labels" not in out  # nothing was scored: no "better" was measured
    assert "nothing was scored" in out
    assert "a target with one is scored" in out and "'label'" in out
    data = json.loads(out_json.read_text())
    assert data["baseline_scaling_by"] == "default" and data["accuracy"]["source_only"] is None


def test_an_error_from_a_flag_names_the_flag(files, capsys) -> None:
    assert main(_simulate(files, "--projection", "target-pca", "--target-epsilon", "1")) != 0
    text = capsys.readouterr().err
    assert "error: --target-row-clip:" in text and "--representation l2" in text
    assert "row_clip:" not in text.replace("--target-row-clip:", "")


def test_a_term_error_names_its_flag_and_the_flags_in_its_text(files, capsys) -> None:
    assert main(_simulate(files, "--noise-multiplier", "0")) != 0
    text = capsys.readouterr().err
    assert "error: --noise-multiplier: " in text and "--batch-size > 0" in text


def test_the_target_files_help_says_a_label_column_is_scored() -> None:
    from dpda.cli.main import build_parser

    subs = [a for a in build_parser()._actions if isinstance(a.choices, dict)]
    sim = next(a.choices["simulate"] for a in subs if "simulate" in a.choices)
    (target_file,) = [a for a in sim._actions if "--target-file" in a.option_strings]
    assert "with a column named as --label-column (e.g. label) the rehearsal is scored" in (
        target_file.help
    )
