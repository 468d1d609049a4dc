"""The documentation's example scripts (docs/examples/), each run as a user runs it, on small
synthetic data: they must exit 0 and print what they promise."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"


def _run(cwd: Path, script: str, *args: str) -> str:
    run = subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, f"{script}\n{run.stdout[-2000:]}\n{run.stderr[-3000:]}"
    return run.stdout


def test_own_csv_to_predictions(tmp_path: Path) -> None:
    out = _run(tmp_path, "own_csv_to_predictions.py", "--demo")
    assert "200 predictions in predictions.csv" in out
    lines = (tmp_path / "predictions.csv").read_text().splitlines()
    assert lines[0] == "id,prediction" and lines[1].startswith("t0,") and len(lines) == 201


def test_sklearn_pipeline(tmp_path: Path) -> None:
    out = _run(tmp_path, "sklearn_pipeline.py", "--epsilons", "2", "8")
    assert out.count("accuracy on the target") == 2


@pytest.mark.skipif(importlib.util.find_spec("skada") is None, reason="skada is not installed")
def test_skada_pipeline(tmp_path: Path) -> None:
    assert "accuracy on the target" in _run(tmp_path, "skada_pipeline.py")


def test_two_daemons_then_read_ledger(tmp_path: Path) -> None:
    work = tmp_path / "work"
    assert "job done: ε spent" in _run(tmp_path, "two_daemons.py", str(work))
    source = _run(tmp_path, "read_ledger.py", str(work / "source"))
    assert "#0 synthetic for target-org" in source and "countersigned" in source
    assert "ledger entries checked: OK" in source
    target = _run(tmp_path, "read_ledger.py", str(work / "target"))
    # the example job as shipped is the rehearsal's default: a source-space release, so the
    # target's copy holds the source's entries and nothing of its own rows was charged
    assert "#0 synthetic for target-org" in target and "own-rows" not in target
    assert "ledger entries checked: OK" in target
    result = json.loads((work / "result.json").read_text())
    assert result["target_epsilon_spent"] == 0.0 and result["accuracy"] > 90
