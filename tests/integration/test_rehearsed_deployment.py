"""The job you deploy is the job you rehearsed: two CSV files → ``dpda simulate
--write-configs DIR`` → ``dpda keys init`` for both organizations → the placeholders filled in
→ ``dpda source serve`` (a real process on port 0) and ``dpda target run --config
DIR/target.toml`` → the rehearsal's predictions (the same bytes) and both parties' ε."""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from dpda.data.synthetic import two_domains
from dpda.deployment import dpda_command

pytestmark = pytest.mark.slow


def _write(path: Path, x, y, prefix: str) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["row_id", *(f"f{j}" for j in range(x.shape[1])), "label"])
        for i, row in enumerate(x):
            w.writerow([f"{prefix}{i}", *row.tolist(), int(y[i])])


def _dpda(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(dpda_command(*args), capture_output=True, text=True, cwd=cwd, timeout=600)


def _fingerprint(stdout: str) -> str:
    m = re.search(r"fingerprint\s+(sha256:[0-9a-f]{64})", stdout)
    assert m, stdout
    return m.group(1)


def _fill_in(path: Path, keys: Path, fingerprint: str, **lines: str) -> None:
    """What a user fills in: the keys' folder, the peer's fingerprint, and any line given."""
    text = path.read_text().replace("FILL-IN-KEYS/", f"{keys}/")
    text = text.replace("sha256:" + "0" * 64, fingerprint)
    for key, value in lines.items():
        text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, count=1, flags=re.M)
    assert "FILL-IN" not in text
    path.write_text(text)


def _sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.parametrize(
    ("flags", "rows"),
    [
        ((), (300, 200)),  # the defaults: a source-space release, nothing of the target sent
        # the target's own basis and scaling under its DP: its ε is charged in both (CI runs
        # it after the README's test command, -m soak)
        pytest.param(
            ("--projection", "target-pca", "--target-epsilon", "2", "--representation", "l2"),
            (300, 200),
            marks=pytest.mark.soak,
        ),
        # three points a class: the written configs carry them to the deployed job
        pytest.param(("--cells", "3"), (1200, 300), marks=pytest.mark.soak),
    ],
    ids=["defaults", "target-pca-under-dp", "several-points-a-class"],
)
def test_the_written_configs_run_the_rehearsed_job(
    tmp_path: Path, flags: tuple[str, ...], rows: tuple[int, int]
) -> None:
    s, t = two_domains(*rows)
    _write(tmp_path / "S.csv", s.x, s.labels(), "s")
    _write(tmp_path / "T.csv", t.x, t.labels(), "t")  # labeled: the rehearsal scores it

    r = _dpda(
        "simulate", "--source-file", "S.csv", "--target-file", "T.csv", "--label-column",
        "label", "--id-column", "row_id", "--seed", "7", "--epsilon", "6", *flags,
        "--json", "rehearsal.json", "--write-configs", "deploy", cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    rehearsal = json.loads((tmp_path / "rehearsal.json").read_text())
    assert rehearsal["cells"] == (3 if "--cells" in flags else 1)
    deploy = tmp_path / "deploy"
    assert (deploy / "source.toml").is_file() and (deploy / "target.toml").is_file()

    keys = tmp_path / "keys"
    ks = _dpda("keys", "init", "--org", "source-org", "--out", str(keys), cwd=tmp_path)
    assert ks.returncode == 0, ks.stderr
    kt = _dpda(
        "keys", "init", "--org", "target-org", "--out", str(keys), "--ca", str(keys / "ca"),
        cwd=tmp_path,
    )  # fmt: skip
    assert kt.returncode == 0, kt.stderr
    _fill_in(deploy / "source.toml", keys, _fingerprint(kt.stdout), listen='"127.0.0.1:0"')
    state = deploy / "source-state"
    state.mkdir()
    with open(tmp_path / "source.log", "ab") as log:
        proc = subprocess.Popen(
            dpda_command("source", "serve", "--config", str(deploy / "source.toml")),
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        deadline = time.monotonic() + 60
        while not (state / "port").is_file():
            assert proc.poll() is None, (tmp_path / "source.log").read_text()
            assert time.monotonic() < deadline, "source serve did not start"
            time.sleep(0.05)
        port = int((state / "port").read_text())
        _fill_in(
            deploy / "target.toml", keys, _fingerprint(ks.stdout),
            source_address=f'"localhost:{port}"',
        )  # fmt: skip
        r = _dpda(
            "target", "run", "--config", str(deploy / "target.toml"), "--quiet", "--json",
            "job.json", cwd=tmp_path,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr + r.stdout
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    job = json.loads((tmp_path / "job.json").read_text())
    assert _sha256(job["predictions"]) == _sha256(rehearsal["predictions"])
    assert job["epsilon_job"] == pytest.approx(rehearsal["epsilon_spent"], abs=1e-9)
    assert job["target_epsilon_spent"] == pytest.approx(rehearsal["target_epsilon_spent"], abs=1e-9)
    if "--target-epsilon" in flags:
        assert job["target_epsilon_spent"] > 0  # the target's rows were charged, as rehearsed
    assert job["accuracy"] == pytest.approx(rehearsal["accuracy"]["kept"], abs=1e-9)
    assert job["cells"] == rehearsal["cells"]
