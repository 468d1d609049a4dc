"""``dpda bench load``, the short version (issue 12): 4 honest sessions and PATE queries for 10 s
against one source daemon process while a hostile client floods it. No honest operation may
fail; latency percentiles, the hostile requests and the source's peak RSS are reported."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dpda.bench.load import REQUIRED_KEYS
from dpda.deployment import dpda_command


@pytest.mark.slow
def test_bench_load_short(tmp_path: Path) -> None:
    out = tmp_path / "load.json"
    res = subprocess.run(
        dpda_command("bench", "load", "--duration", "10", "--sessions", "4", "--json", str(out)),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert out.is_file(), res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(REQUIRED_KEYS) <= set(data)
    assert data["sessions"] == 4
    assert data["errors"] == 0, data["error_messages"]
    assert data["p50_ms"] > 0
    assert data["p99_ms"] >= data["p50_ms"]
    assert data["hostile_requests"] > 0
    assert data["peak_rss_mb"] > 0
    # the honest sessions did real work, and the source's ledger still verifies
    assert data["releases"] > 0 and data["sessions_closed"] > 0
    assert data["ledger"]["verify_problems"] == []
    # nothing the hostile client sent was served but the health check open to any TLS client
    assert data["hostile_served"] == 0, data["hostile_codes"]
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
