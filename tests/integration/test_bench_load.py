"""``dpda bench load``, the short version (issue 12): 4 honest sessions and PATE queries for 10 s
against one source daemon process while a hostile client floods it. No honest operation may
fail; latency percentiles, the hostile requests and the source's peak RSS are reported."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from dpda.deployment import dpda_command
from tests.bench.load_report import REQUIRED_KEYS


@pytest.mark.slow
@pytest.mark.soak  # a benchmark's short run: CI runs it after the README's test command (-m soak)
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


def test_hostile_patterns_are_named_and_checked() -> None:
    from tests.bench.hostile import PATTERNS, parse_patterns

    assert parse_patterns("all") == PATTERNS and parse_patterns("none") == ()
    assert parse_patterns("bytes, hint,bytes") == ("bytes", "hint")
    with pytest.raises(ValueError, match="--hostile: lots is not one of"):
        parse_patterns("flood,lots")


@pytest.mark.slow
@pytest.mark.soak  # a benchmark's short run: CI runs it after the README's test command (-m soak)
def test_bench_load_with_every_hostile_pattern(tmp_path: Path) -> None:
    """The hostile patterns of the review (an unpinned certificate's concurrent 31 MiB
    messages, a pinned peer's longest planned-terms hints, 100,000-query PATE requests and
    eight OpenSessions planning at once) beside the flood: the JSON names them and counts
    their requests; no honest operation fails and the ledger verifies."""
    out = tmp_path / "load.json"
    cmd = ("bench", "load", "--duration", "10", "--sessions", "2", "--hostile", "all")
    res = subprocess.run(
        dpda_command(*cmd, "--json", str(out)),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert out.is_file(), res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(REQUIRED_KEYS) <= set(data)
    assert data["hostile_patterns"] == ["flood", "bytes", "hint", "pate", "plan"]
    by = data["hostile_by_pattern"]
    # every pattern is counted; the bytes pattern always gets its messages in within 10 s, a
    # hint process on a loaded 2-core machine may not start sending before the run ends
    assert set(by) == {"bytes", "hint", "pate", "plan"} and by["bytes"] > 0  # and the flood
    assert data["errors"] == 0, data["error_messages"]
    assert data["hostile_served"] == 0, data["hostile_codes"]
    assert data["ledger"]["verify_problems"] == []
