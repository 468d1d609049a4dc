"""Labels as names in tables, mapped back in the predictions; the saved model checks the width
of what it is given."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

from dpda.cli.main import main
from dpda.data.preprocessing import Scaling
from dpda.data.synthetic import two_domains
from dpda.data.tables import read_table
from dpda.target_party.training import make_classifier, model_pipeline

NAMES = np.array(["cat", "dog", "eel", "fox", "gnu"])


def _write(path: Path, x: np.ndarray, labels: np.ndarray | None) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            [*(f"f{j}" for j in range(x.shape[1])), *(["label"] if labels is not None else [])]
        )
        for i, row in enumerate(x):
            w.writerow([*row.tolist(), *([labels[i]] if labels is not None else [])])


@pytest.mark.slow  # a whole in-process job
def test_labels_as_names_are_read_and_mapped_back(tmp_path: Path) -> None:
    s, t = two_domains(200, 80, k=8)
    _write(tmp_path / "S.csv", s.x, NAMES[s.labels()])
    _write(tmp_path / "T.csv", t.x, NAMES[t.labels()])  # names too: scored by name
    table = read_table(tmp_path / "S.csv", "label")
    assert table.label_names == tuple(NAMES) and table.y.tolist() == s.labels().tolist()
    code = main([
        "simulate", "--source-file", str(tmp_path / "S.csv"), "--target-file",
        str(tmp_path / "T.csv"), "--label-column", "label", "--seed", "0", "--projection-dim",
        "4", "--json", str(tmp_path / "r.json"), "--predictions", str(tmp_path / "p.csv"),
    ])  # fmt: skip
    assert code == 0
    with open(tmp_path / "p.csv", newline="") as fh:
        pred = [row["prediction"] for row in csv.DictReader(fh)]
    assert set(pred) <= set(NAMES) and len(pred) == 80
    # the target's names were scored as the source's classes: the JSON's accuracy of the model
    # the job keeps (whose predictions are written) is the agreement of the names written
    agree = 100 * np.mean(np.array(pred) == NAMES[t.labels()])
    assert json.loads((tmp_path / "r.json").read_text())["accuracy"]["kept"] == pytest.approx(agree)


def test_the_saved_model_names_a_wrong_width() -> None:
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 4)), np.arange(30) % 2
    clf = make_classifier("1nn").fit(x, y)
    model = model_pipeline("raw", Scaling(np.zeros(4), np.ones(4)), clf)
    assert model.predict(x).shape == (30,)
    with pytest.raises(ValueError, match="takes rows of 4 features .* these rows have 3 columns"):
        model.predict(x[:, :3])
