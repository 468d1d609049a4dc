"""`dpda bench speed` runs end to end on tiny problems and writes the JSON the issue names."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpda.cli.main import main
from tests.bench.speed import PeakMemory

pytestmark = pytest.mark.slow  # every test here takes seconds (real daemons or long runs)


@pytest.mark.soak  # a benchmark's short run: CI runs it after the README's test command (-m soak)
def test_bench_speed_smoke(tmp_path, capsys) -> None:
    out = tmp_path / "speed.json"
    argv = ["bench", "speed", "--sizes", "500", "--job-sizes", "400", "--json", str(out)]
    argv += ["--visda-source", "3000", "--visda-target", "1000", "--visda-batch", "300"]
    argv += ["--visda-steps", "3", "--visda-target-batch", "0", "--visda-dim", "16"]
    argv += ["--visda-subset-batch", "400"]
    argv += ["--bandwidth-n", "1500"]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    for key in ("ot_gl", "sinkhorn"):
        row = data[key][0]
        assert set(row) == {
            "n",
            "ours_s",
            "pot_s",
            "ratio",
            "ours_peak_mb",
            "pot_peak_mb",
            "plan_agreement",
        }
        assert row["n"] == 500 and row["ours_s"] > 0 and row["pot_s"] > 0
        assert row["plan_agreement"] > 0.95  # the same problem, nearly the same plan
    job = data["job_scaling"][0]
    assert job["n_source"] == 400 and job["seconds"] > 0 and job["peak_mb"] > 50
    assert 0 <= job["accuracy"] <= 100 and job["solver_converged"]
    visda = data["visda"]
    assert {"seconds", "peak_mb", "accuracy"} <= set(visda)
    assert visda["batches"] == 3 and visda["epsilon_spent"] > 0
    # every target row, and the 400-row subset job beside it; what each fit read
    assert visda["subset"]["target_batch"] == 400 and visda["target_batch"] == 0
    assert visda["subset_accuracy"] == visda["subset"]["accuracy"]
    assert visda["passes_per_fit"] > 0 and visda["kernel_builds_per_fit"] >= 2
    assert 1 < visda["read_over_pass_bytes"] < 3
    assert visda["read_gbs"] > 0 and 0 < visda["pass_bound_seconds_per_fit"] < visda["seconds"]
    # a ratio of two timed rates: positive and finite (its size depends on the machine's load)
    assert 0 < data["bandwidth_fraction"] < float("inf")
    assert data["bandwidth"]["read_gbs"] > 0
    assert "plan agreement" in capsys.readouterr().out


def test_peak_memory_counts_the_block_not_what_came_before() -> None:
    before = np.ones(40 * 2**20 // 8)  # 40 MB held (and touched) before the block
    with PeakMemory() as small:
        np.ones(2**20 // 8).sum()
    with PeakMemory() as big:
        x = np.ones(120 * 2**20 // 8)  # 120 MB inside the block
        del x
    assert big.peak_mb > 100
    assert small.peak_mb < 30
    assert before[0] == 1.0
