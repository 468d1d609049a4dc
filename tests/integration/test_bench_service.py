"""``dpda bench service``, short: both arms run, give the same result, and the JSON has the
numbers the README quotes (the full run is a command, not a CI step)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dpda.deployment import dpda_command


@pytest.mark.soak  # a benchmark's short run: CI runs it after the README's test command (-m soak)
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
    # each job split: its calls to the source, and the target's own compute (the rest)
    for arm in ("in_process", "service", "in_process_warm"):
        for run in case[arm]["runs"]:
            assert 0 < run["source_seconds"] < run["seconds"]
        rest = sorted(r["seconds"] - r["source_seconds"] for r in case[arm]["runs"])
        assert case[arm]["target_seconds"] == pytest.approx(sum(rest) / 2, rel=1e-12)
    lo, hi = case["ratio_interval"]
    assert lo <= case["ratio"] <= hi
    svc, fresh = case["service"]["runs"], case["in_process"]["runs"]
    runs = [s["seconds"] / f["seconds"] for s, f in zip(svc, fresh, strict=True)]
    assert case["ratio_paired"] == pytest.approx(sum(runs) / 2, rel=1e-12)  # median of two


def test_the_ratio_interval_covers_what_the_runs_allow() -> None:
    """The bootstrap interval of median / median: reproducible (fixed seed), ordered, it holds
    the ratio of the medians, it is a point when neither arm varies, and it widens with the
    spread of the runs."""
    from tests.bench.service import ratio_interval

    svc, base = [1.10, 1.02, 1.31, 1.05, 1.07], [1.00, 0.98, 1.04, 1.20, 1.01]
    lo, hi = ratio_interval(svc, base)
    assert (lo, hi) == ratio_interval(svc, base)
    assert lo <= 1.07 / 1.01 <= hi and lo < hi
    assert ratio_interval([2.0] * 5, [1.0] * 5) == (2.0, 2.0)
    narrow = ratio_interval([1.05, 1.06, 1.05, 1.06, 1.05], [1.0, 1.01, 1.0, 1.01, 1.0])
    assert narrow[1] - narrow[0] < hi - lo
