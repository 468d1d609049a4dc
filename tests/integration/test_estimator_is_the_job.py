"""The same job in Python as on the command line: ``DPDAClassifier`` with the knobs given to
``dpda simulate`` (each by the same name) gives its predictions and its ε for the same files
and seed; frames and tables are matched by column name in ``fit``, ``predict`` and ``score``,
and refused, naming the columns, when the names differ."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest

import dpda
from dpda.cli.main import main
from dpda.data.synthetic import two_domains
from dpda.errors import ConfigError

pytestmark = pytest.mark.slow


def _write(path: Path, x, y, order=None) -> None:
    k = x.shape[1]
    order = list(range(k)) if order is None else order
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow([*(f"f{j}" for j in order), *(["label"] if y is not None else [])])
        for i, row in enumerate(x):
            w.writerow([*row[order].tolist(), *([int(y[i])] if y is not None else [])])


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("estimator-job")
    s, t = two_domains(300, 200, k=6)
    _write(tmp / "S.csv", s.x, s.labels())
    _write(tmp / "T.csv", t.x, t.labels())
    _write(tmp / "T_shuffled.csv", t.x, t.labels(), order=[3, 0, 5, 1, 4, 2])
    return tmp


KNOBS = {  # flag value → the estimator's parameter of the same name
    "knobs": {"refine": 0.3, "transport_step": 0.8, "keep": "dpda", "clip_norm": 0.9,
              "classifier": "logistic"},
    "target-pca-under-dp": {"projection": "target-pca", "target_epsilon": 2.0,
                            "representation": "l2", "projection_dim": 4},
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(KNOBS))
def test_the_estimator_gives_simulates_predictions_and_epsilon(files, case: str) -> None:
    knobs = KNOBS[case]
    flags = [f for k, v in knobs.items() for f in ("--" + k.replace("_", "-"), str(v))]
    out = files / f"{case}.json"
    argv = [
        "simulate", "--source-file", str(files / "S.csv"), "--target-file",
        str(files / "T.csv"), "--label-column", "label", "--seed", "5", "--epsilon", "6",
        *flags, "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    rehearsal = json.loads(out.read_text())
    with open(rehearsal["predictions"], newline="") as fh:
        rehearsed = [row["prediction"] for row in csv.DictReader(fh)]

    src = dpda.read_table(files / "S.csv", "label")
    tgt = dpda.read_table(files / "T.csv", "label", labels="optional")
    clf = dpda.DPDAClassifier(epsilon=6.0, random_state=5, **knobs).fit(src, src.y, tgt)
    assert [str(v) for v in clf.target_predictions_] == rehearsed
    assert [str(v) for v in clf.predict(tgt)] == rehearsed
    assert clf.epsilon_spent_ == pytest.approx(rehearsal["epsilon_spent"], abs=1e-12)
    assert clf.target_epsilon_spent_ == pytest.approx(rehearsal["target_epsilon_spent"])


@pytest.mark.soak  # two jobs over two sources: CI runs it after the README's test command
def test_the_estimator_over_several_sources_is_simulates_job_over_their_files(files) -> None:
    """``fit(X, y, Xt, groups=…)`` splits X into one source a group and runs the job ``dpda
    simulate --source-file S1 --source-file S2`` runs on the same rows: same predictions, the
    same ε at each source, a ledger per source."""
    s, _ = two_domains(300, 200, k=6)
    x, y = s.x, s.labels()  # as l2 rows: a representation the sources share
    groups = np.where(np.arange(x.shape[0]) % 3 == 0, "north", "south")
    for name in ("north", "south"):
        _write(files / f"{name}.csv", x[groups == name], y[groups == name])
    out = files / "two.json"
    argv = [
        "simulate", "--source-file", str(files / "north.csv"), "--source-file",
        str(files / "south.csv"), "--target-file", str(files / "T.csv"), "--label-column",
        "label", "--representation", "l2", "--seed", "3", "--json", str(out),
    ]  # fmt: skip
    assert main(argv) == 0
    rehearsal = json.loads(out.read_text())
    assert set(rehearsal["epsilon_spent_by_source"]) == {"north", "south"}
    with open(rehearsal["predictions"], newline="") as fh:
        rehearsed = [row["prediction"] for row in csv.DictReader(fh)]

    tgt = dpda.read_table(files / "T.csv", "label", labels="optional")
    clf = dpda.DPDAClassifier(representation="l2", random_state=3)
    clf.fit(x, y, tgt.x, groups=groups)
    assert [str(v) for v in clf.target_predictions_] == rehearsed
    assert set(clf.ledger_) == {"north", "south"}
    by_source = rehearsal["epsilon_spent_by_source"]
    assert clf.epsilon_spent_by_source_ == pytest.approx(by_source)
    with pytest.raises(ConfigError, match="groups: one name only"):
        dpda.DPDAClassifier(representation="l2").fit(x, y, tgt.x, groups=["a"] * x.shape[0])
    with pytest.raises(ConfigError, match="groups: 2 names for the 300 rows"):
        dpda.DPDAClassifier(representation="l2").fit(x, y, tgt.x, groups=["a", "b"])


def test_tables_are_matched_by_column_name(files) -> None:
    src = dpda.read_table(files / "S.csv", "label")
    tgt = dpda.read_table(files / "T.csv", "label", labels="optional")
    shuffled = dpda.read_table(files / "T_shuffled.csv", "label", labels="optional")
    assert shuffled.columns != tgt.columns
    a = dpda.DPDAClassifier(random_state=1).fit(src, src.y, tgt)
    b = dpda.DPDAClassifier(random_state=1).fit(src, src.y, shuffled)
    assert np.array_equal(a.target_predictions_, b.target_predictions_)
    assert np.array_equal(a.predict(shuffled), a.predict(tgt))
    assert a.score(shuffled, tgt.y) == a.score(tgt, tgt.y) > 0.5  # chance: 0.2


def test_frames_are_matched_by_column_name_and_refused_naming_the_columns(files) -> None:
    pd = pytest.importorskip("pandas")
    s = pd.read_csv(files / "S.csv")
    t = pd.read_csv(files / "T.csv")
    xs, ys, xt, yt = s.drop(columns="label"), s["label"], t.drop(columns="label"), t["label"]
    reordered = xt[list(reversed(xt.columns))]
    a = dpda.DPDAClassifier(random_state=2).fit(xs, ys, xt)
    b = dpda.DPDAClassifier(random_state=2).fit(xs, ys, reordered)
    assert np.array_equal(a.target_predictions_, b.target_predictions_)
    assert np.array_equal(a.predict(reordered), a.predict(xt))
    assert a.score(reordered, yt) == a.score(xt, yt)
    renamed = xt.rename(columns={"f2": "width"})
    with pytest.raises(ValueError, match=r"lacks 'f2'.*has 'width'"):
        a.predict(renamed)
    with pytest.raises(ValueError, match=r"Xt lacks 'f2'"):
        dpda.DPDAClassifier(random_state=2).fit(xs, ys, renamed)
