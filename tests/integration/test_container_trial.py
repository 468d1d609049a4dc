"""The container trial (deploy/trial.sh) end to end: wheels, the image, keys and configs outside
the checkout, one job through compose, `dpda ledger verify` on both parties' volumes. Needs a
Docker daemon, Compose and a base image; skips with the reason where one is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LOCAL_BASE = "dpda-base:bookworm"  # what deploy/make-base.sh builds


def _docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)


def _base_or_skip() -> str | None:
    if shutil.which("docker") is None:
        pytest.skip("no docker command")
    if _docker("info").returncode != 0:
        pytest.skip("no Docker daemon reachable")
    has_compose = _docker("compose", "version").returncode == 0 or shutil.which("docker-compose")
    if not has_compose:
        pytest.skip("neither 'docker compose' nor 'docker-compose' is installed")
    if os.environ.get("DPDA_BASE"):
        return os.environ["DPDA_BASE"]
    if _docker("image", "inspect", LOCAL_BASE).returncode == 0:
        return LOCAL_BASE
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    default = next(
        ln.split("=", 1)[1] for ln in dockerfile.splitlines() if ln.startswith("ARG BASE=")
    )
    if _docker("image", "inspect", default).returncode != 0:
        pytest.skip(f"no base image: {default} is not here (set DPDA_BASE, or run make-base.sh)")
    return None


@pytest.mark.docker
def test_the_container_trial_runs_to_verified_ledgers(tmp_path: Path) -> None:
    base = _base_or_skip()
    env = {**os.environ, **({"DPDA_BASE": base} if base else {})}
    run = subprocess.run(
        [str(ROOT / "deploy" / "trial.sh"), str(tmp_path / "trial")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]
    assert out.count("ledger entries checked: OK") == 2
    assert out.count("audit records checked: OK") == 2
    assert "trial passed in" in out and "exited with code 0" in out
