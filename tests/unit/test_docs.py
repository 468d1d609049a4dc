"""The README and the documentation site: short, free of lab notes, one version everywhere, and
every Python code block runs (so the documentation cannot rot)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from dpda.data.synthetic import two_domains

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]

QUICK_START = (
    "python3 -m venv .venv && .venv/bin/pip install -e . && .venv/bin/dpda demo",
    "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' "
    "--config-settings editable_mode=strict && .venv/bin/python -m pytest -q",
)

# what a user reading the documentation cannot know or does not need: the project's own history
LAB_NOTES = re.compile(
    r"seed 00\d|seed paper|issue \d+|\(#\d+\)|#\d+\b|\bbefore #|used to say|was not run|"
    r"not re-run|DESIGN\.md|DESIGN §|this round|last round|\bcommit [0-9a-f]{7,40}\b",
    re.IGNORECASE,
)


def _user_facing_texts() -> list[Path]:
    files = [README, ROOT / "CHANGELOG.md", *sorted(DOCS.rglob("*.md"))]
    files += sorted((ROOT / "deploy").rglob("*.toml")) + [ROOT / "deploy" / "README.md"]
    files += [ROOT / "deploy" / "Dockerfile", ROOT / "deploy" / "docker-compose.yml"]
    return files


def test_the_readme_is_short_and_keeps_the_quick_start_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    for command in QUICK_START:
        assert command in text
    assert "## Dependencies and why" in text


def test_the_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    strict = "--config-settings editable_mode=strict"
    assert f"pip install --quiet -e '.[test]' {strict} && python -m pytest -q" in ci
    assert "mkdocs build --strict" in ci


@pytest.mark.parametrize("path", _user_facing_texts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_lab_notes(path: Path) -> None:
    found = [m.group(0) for m in LAB_NOTES.finditer(path.read_text())]
    assert not found, f"{path.relative_to(ROOT)}: {found}"


def test_every_page_is_in_the_navigation_and_every_link_target_exists() -> None:
    config = (ROOT / "mkdocs.yml").read_text()
    for page in DOCS.glob("*.md"):
        assert f": {page.name}" in config, f"{page.name} is not in mkdocs.yml's nav"
    for link in re.findall(r"\]\((docs/[^)#]+)", README.read_text()):
        assert (ROOT / link).exists(), link


@pytest.mark.slow
def test_one_version_everywhere() -> None:
    import dpda

    assert dpda.__version__ == VERSION
    mkdocs = (ROOT / "mkdocs.yml").read_text()
    assert re.search(r"^copyright: dpda (\S+) ", mkdocs, re.M).group(1) == VERSION
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^ARG VERSION=(\S+)$", dockerfile, re.M).group(1) == VERSION
    compose = (ROOT / "deploy" / "docker-compose.yml").read_text()
    assert set(re.findall(r"dpda:\$\{DPDA_VERSION:-([^}]+)\}", compose)) == {VERSION}
    releases = re.findall(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert releases and releases[0] == VERSION
    out = subprocess.run(
        [sys.executable, "-m", "dpda.cli", "--version"], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == f"dpda {VERSION}"


def test_the_container_files_keep_their_safety_properties() -> None:
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE=\S+@sha256:[0-9a-f]{64}$", dockerfile, re.M)
    assert "USER 10001" in dockerfile and "--no-index" in dockerfile
    ignore = (ROOT / ".dockerignore").read_text().split()
    assert ignore[ignore.index("*") + 1 :] == ["!deploy/wheels/"]  # nothing else gets in
    compose = (ROOT / "deploy" / "docker-compose.yml").read_text()
    assert "condition: service_healthy" in compose and "healthcheck:" in compose
    assert "ca.key" not in compose and "/keys/ca" not in compose
    # read-only file systems: in the anchor every service of the image merges
    assert "read_only: true" in compose[: compose.index("services:")]
    assert compose.count("<<: *hardened") == compose.count("image: dpda:")


def test_the_image_is_built_in_two_stages_and_its_containers_hold_no_privilege() -> None:
    """The wheels live only in the build stage; every service drops every capability, cannot
    gain privileges, has a memory limit and a restart policy (the target's job: none)."""
    dockerfile = (ROOT / "deploy" / "Dockerfile").read_text()
    stages = re.split(r"^FROM ", dockerfile, flags=re.M)[1:]
    assert len(stages) == 2 and stages[0].startswith("${BASE} AS build")
    assert "deploy/wheels" in stages[0] and "deploy/wheels" not in stages[1]
    assert "COPY --from=build /opt/dpda /opt/dpda" in stages[1] and "USER 10001" in stages[1]
    compose = (ROOT / "deploy" / "docker-compose.yml").read_text()
    anchor = compose[compose.index("x-hardened: &hardened") : compose.index("services:")]
    assert "cap_drop: [ALL]" in anchor and '"no-new-privileges:true"' in anchor
    block = compose[compose.index("services:") : compose.index("\nvolumes:")]
    services = re.split(r"^  (\S+):", block, flags=re.M)[1:]
    found = dict(zip(services[::2], services[1::2], strict=True))
    assert {"source", "target", "scheduler", "worker-1"} <= set(found)
    for name, body in found.items():
        if name == "worker-2":  # the same as worker-1 (a YAML alias)
            continue
        assert "<<: *hardened" in body and re.search(r"mem_limit: \d+g", body), name
        assert re.search(r"restart: \S+", body), name
    assert 'restart: "no"' in found["target"] and "restart: unless-stopped" in found["source"]


def test_the_systemd_units_are_sandboxed_and_start_without_the_data_folder() -> None:
    options = [
        "SystemCallFilter=@system-service",
        "RestrictSUIDSGID=yes",
        "ProtectClock=yes",
        "ProtectKernelLogs=yes",
        "ProtectHostname=yes",
        "ProtectProc=invisible",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=",
    ]
    for unit in sorted((ROOT / "deploy" / "systemd").glob("*.service")):
        lines = unit.read_text().splitlines()
        for option in options:
            assert option in lines, (unit.name, option)
        ro = next(ln for ln in lines if ln.startswith("ReadOnlyPaths="))
        assert "-/srv/data" in ro.split("=", 1)[1].split(), unit.name
        assert "User=dpda" in lines
    ops = (DOCS / "operations.md").read_text()
    assert "useradd --system" in ops and "dpda" in ops  # how the unit's user is made


def test_the_readmes_docs_command_names_the_config_that_exists() -> None:
    readme = README.read_text()
    cmd = re.search(r"`pip install -e '\.\[docs\]' && (mkdocs serve[^`]*)`", readme).group(1)
    given = re.search(r"-f (\S+)", cmd)
    assert (ROOT / (given.group(1) if given else "mkdocs.yml")).is_file(), cmd


def test_the_trial_reads_the_jobs_folder_and_verifies_each_ledger_against_the_other() -> None:
    trial = (ROOT / "deploy" / "trial.sh").read_text()
    assert "/jobs/*/results.json" in trial and "target/results.json" not in trial
    assert "ledger verify /var/lib/dpda/source --against /var/lib/dpda/target" in trial
    assert "ledger verify /var/lib/dpda/target --against /var/lib/dpda/source" in trial
    for what in ("docker.io", "docker-compose", "debootstrap", "python3-venv"):
        assert f"apt-get install {what}" in trial or what in trial, what


def _python_blocks() -> list[tuple[str, int, str]]:
    blocks = []
    for path in [README, *sorted(DOCS.glob("*.md"))]:
        text = path.read_text()
        for m in re.finditer(r"^( *)```python\n(.*?)^\1```", text, re.M | re.S):
            code = "\n".join(line[len(m.group(1)) :] for line in m.group(2).splitlines())
            if not code.lstrip().startswith("--8<--"):  # an included example: tested on its own
                blocks.append((path.name, text[: m.start()].count("\n") + 1, code))
    return blocks


@pytest.mark.slow
@pytest.mark.parametrize("name,line,code", _python_blocks(), ids=lambda v: str(v)[:24])
def test_the_python_code_blocks_run(tmp_path: Path, name: str, line: int, code: str) -> None:
    """Each block runs on its own, in a folder holding the S.csv and T.csv the README's blocks
    read (the synthetic problem, with a header and row ids)."""
    s, t = two_domains(n_source=300, n_target=200, k=10, seed=0)
    header = ",".join(f"f{j}" for j in range(10))
    np.savetxt(
        tmp_path / "S.csv",
        np.column_stack([np.arange(300), s.x, s.y]),
        delimiter=",",
        header=f"row_id,{header},label",
        comments="",
        fmt="%.6g",
    )
    np.savetxt(
        tmp_path / "T.csv",
        np.column_stack([np.arange(200), t.x]),
        delimiter=",",
        header=f"row_id,{header}",
        comments="",
        fmt="%.6g",
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert run.returncode == 0, f"{name}:{line}\n{run.stderr[-3000:]}"
