"""``dpda bench service``, short: both arms run, give the same result, and the JSON has the
numbers the README quotes (the full run is a command, not a CI step)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from dpda.deployment import dpda_command


def test_bench_service_short(tmp_path: Path) -> None:
    out = tmp_path / "service.json"
    r = subprocess.run(
        dpda_command(
            "bench", "service", "--skip-office", "--synthetic-rows", "400", "--batch-size",
            "100", "--steps", "2", "--repeats", "2", "--workdir", str(tmp_path / "w"),
            "--json", str(out),
        ),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    (case,) = json.loads(out.read_text())["cases"]
    assert case["same_result"] and case["repeats"] == 2
    assert len(case["in_process"]["runs"]) == len(case["service"]["runs"]) == 2
    assert case["ratio"] == case["service"]["seconds"] / case["in_process"]["seconds"] > 0
    assert case["service"]["bytes_on_wire"] > 0
    # the warm arm (this process, after an untimed run) is reported beside the fresh one
    assert len(case["in_process_warm"]["runs"]) == 2
    assert case["ratio_vs_warm"] == case["service"]["seconds"] / case["in_process_warm"]["seconds"]
    assert json.loads(out.read_text())["blas_threads"] == 1
