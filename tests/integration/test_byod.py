"""Bring your own data, end to end, as the README tells it: two CSV files with headers (the
target's without labels) → a free rehearsal (``dpda simulate``) → the same with the Python
estimator → a preflight (``dpda target plan``) → the real two-daemon job → the predictions and
the saved model loaded back. Real processes, real mTLS, real SQLite files."""

from __future__ import annotations

import csv
import json
import subprocess
from pathlib import Path

import numpy as np

import dpda
from dpda.data.synthetic import two_domains
from dpda.deployment import SourceProcess, dpda_command, make_deployment, run_target

EPSILON = 6.0
DELTA = 1e-4


def _write(path: Path, x: np.ndarray, y: np.ndarray | None, prefix: str) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(
            ["row_id", *(f"f{j}" for j in range(x.shape[1])), *(["label"] if y is not None else [])]
        )
        for i, row in enumerate(x):
            w.writerow([f"{prefix}{i}", *row.tolist(), *([int(y[i])] if y is not None else [])])


def _dpda(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(dpda_command(*args), capture_output=True, text=True, cwd=cwd, timeout=600)


def test_two_csv_files_to_predictions_and_a_model(tmp_path: Path) -> None:
    s, t = two_domains(500, 300)
    _write(tmp_path / "S.csv", s.x, s.labels(), "s")
    _write(tmp_path / "T.csv", t.x, None, "t")  # the target has no labels

    # 1. the free rehearsal: nothing is charged anywhere
    r = _dpda(
        "simulate", "--source-file", "S.csv", "--target-file", "T.csv", "--label-column",
        "label", "--id-column", "row_id", "--epsilon", str(EPSILON), "--delta", str(DELTA),
        "--json", "rehearsal.json", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rehearsal = json.loads((tmp_path / "rehearsal.json").read_text())
    assert rehearsal["accuracy"]["dpda"] is None and rehearsal["accuracy"]["source_only"] is None
    assert 0 < rehearsal["epsilon_spent"] <= EPSILON
    rows = _read(rehearsal["predictions"])
    assert [row["id"] for row in rows] == [f"t{i}" for i in range(300)]
    rehearsed = np.array([int(row["prediction"]) for row in rows])
    assert np.mean(rehearsed == t.labels()) > 0.9  # scored here only: the test knows the truth

    # 2. the same with the Python estimator
    src = dpda.read_table(tmp_path / "S.csv", "label", id_column="row_id")
    tgt = dpda.read_table(tmp_path / "T.csv", "label", labels="optional", id_column="row_id")
    clf = dpda.DPDAClassifier(epsilon=EPSILON, delta=DELTA).fit(src.x, src.y, tgt.x)
    assert 0 < clf.epsilon_spent_ <= EPSILON
    assert np.mean(clf.predict(tgt.x) == t.labels()) > 0.9

    # 3. the two daemons: the source holds S.csv, the target T.csv
    dep = make_deployment(
        tmp_path / "deploy",
        dataset={"name": "mine", "kind": "table", "path": str(tmp_path / "S.csv"),
                 "label_column": "label", "id_column": "row_id", "epsilon": 10.0,
                 "delta": DELTA},
        job={"dataset": "mine", "data_kind": "table", "data_path": str(tmp_path / "T.csv"),
             "label_column": "label", "id_column": "row_id", "epsilon": EPSILON,
             "delta": DELTA},
        target_privacy={"disclosures": "exact"},  # compared with the in-process runs above
    )  # fmt: skip
    source = SourceProcess(dep)
    try:
        # 4. preflight: σ, the charge and what remains, before anything is spent
        r = _dpda("target", "plan", "--config", str(dep.target_config), "--json", "plan.json",
                  cwd=tmp_path)  # fmt: skip
        assert r.returncode == 0, r.stderr
        plan = json.loads((tmp_path / "plan.json").read_text())
        assert {"sigma", "epsilon_charge", "epsilon_remaining"} <= set(plan)
        fc = plan["forecast"]  # from public facts: rows, classes, σ, C, ℓ
        assert fc["noise_to_signal"] > 0 and isinstance(fc["noise_dominated"], bool)
        assert plan["target"]["epsilon_charge"] == 0.0  # nothing of the target is sent
        assert plan["epsilon_remaining"] == 10.0 and 0 < plan["epsilon_charge"] <= EPSILON
        ch = plan["epsilon_by_channel"]  # the record unit: features and histogram, no PATE
        assert ch["pate"] == 0 and 0 < ch["features"] <= plan["epsilon_charge"] + 1e-9
        assert 0 < ch["histogram"] < plan["epsilon_charge"]
        # raw rows in source space: the source's DP standardization is charged too, planned
        assert plan["preprocessing"]["mode"] == "standardize" and ch["preprocessing"] > 0
        assert plan["epsilon_charge"] <= ch["features"] + ch["histogram"] + ch["preprocessing"]
        assert not (dep.source_state / "state.sqlite").exists() or not _entries(dep)
        # 5. the real job
        res = run_target(dep, "--json", str(tmp_path / "result.json"))
        assert res.returncode == 0, res.stderr
    finally:
        source.stop()
    out = json.loads((tmp_path / "result.json").read_text())
    assert out["accuracy"] is None  # no labels on the target
    assert out["sigma"] == plan["sigma"]
    assert abs(out["epsilon_job"] - plan["epsilon_charge"]) < 1e-6
    # what the source's DP standardization estimated, as the signed entry and release said
    pre = out["preprocessing"]
    assert pre["mode"] == "standardize" and pre["share"] == plan["preprocessing"]["share"]
    assert pre["clip_norm"] > 0 and pre["scale_min"] > 0
    assert abs(out["epsilon_dataset_total"] - plan["epsilon_dataset_after"]) < 1e-6

    # 6. the predictions, keyed by the target's row ids, and the model on raw rows
    rows = _read(out["predictions"])
    assert [row["id"] for row in rows] == [f"t{i}" for i in range(300)]
    pred = np.array([int(row["prediction"]) for row in rows])
    assert np.mean(pred == t.labels()) > 0.9
    model = dpda.load_model(out["model"])
    assert np.array_equal(model.predict(tgt.x), pred)

    # 7. the budget in plain numbers: cap, spent (the dataset's total) and what remains
    r = _dpda("ledger", "show", str(dep.source_state), "--config", str(dep.source_config),
              cwd=tmp_path)  # fmt: skip
    assert r.returncode == 0, r.stderr
    total = out["epsilon_dataset_total"]
    assert f"mine: dataset cap ε 10, spent {total:.4f}" in r.stdout
    assert f"remaining {10 - total:.4f}" in r.stdout


def _read(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _entries(dep) -> list:
    import sqlite3

    with sqlite3.connect(dep.source_state / "state.sqlite") as conn:
        return conn.execute("SELECT * FROM ledger").fetchall()
