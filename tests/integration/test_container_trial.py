"""The container trial (deploy/trial.sh) end to end: wheels for the base's Python, the image
(≤ 600 MB, uid 10001), keys and configs outside the checkout, one job through compose during
which the source's container is killed and restarted (the job resumes, nothing is charged
twice), `dpda ledger verify` on both parties' volumes and each against the other. Needs a
Docker daemon, Compose and a base image; skips with the reason where one is missing, and in CI
(``CI=true``, where .ci/run installs them and builds the base) fails instead."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from .helpers import need

ROOT = Path(__file__).resolve().parents[2]
LOCAL_BASE = "dpda-base:bookworm"  # what deploy/make-base.sh builds


def _docker(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, timeout=60)


def _base_or_skip() -> str | None:
    need(shutil.which("docker"), "no docker command (apt-get install docker.io)")
    need(_docker("info").returncode == 0, "no Docker daemon reachable (start dockerd)")
    has_compose = _docker("compose", "version").returncode == 0 or shutil.which("docker-compose")
    need(has_compose, "neither 'docker compose' nor 'docker-compose' is installed")
    if os.environ.get("DPDA_BASE"):
        return os.environ["DPDA_BASE"]
    if _docker("image", "inspect", LOCAL_BASE).returncode == 0:
        return LOCAL_BASE
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    default = next(
        ln.split("=", 1)[1] for ln in dockerfile.splitlines() if ln.startswith("ARG BASE=")
    )
    need(
        _docker("image", "inspect", default).returncode == 0,
        f"no base image: {default} is not here (set DPDA_BASE, or run deploy/make-base.sh)",
    )
    return None


@pytest.mark.docker
@pytest.mark.soak  # the container trial: CI runs it after the README's test command (-m soak)
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
    print(run.stdout[-8000:])  # the trial's own account, for the CI log (-rP)
    assert run.returncode == 0, out[-5000:]
    assert out.count("ledger entries checked: OK") == 4  # each alone, each against the other
    assert out.count("audit records checked: OK") == 2
    assert "trial passed in" in out and "target exited with code 0" in out
    size = int(re.search(r"image dpda:\S+: (\d+) MB", out).group(1))
    assert 0 < size <= 600
    # the fault: the source crashed at its crash point mid-job and restarted, the job ended
    # well, no release charged twice
    assert "source killed at its crash point" in out
    assert "source restarted: running, restarts 1" in out
    assert "while the source was down, and finished" in out and "no release charged twice" in out
