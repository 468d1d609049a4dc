"""The package's layers: a module imports only from its own layer or the layers below it, the
two parties never import each other, and the math below the service runs without its
third-party packages. The contracts are import-linter's, in pyproject.toml; docs/architecture.md
lists the same order. ``lint-imports`` reads the installed package (a strict editable install is
a plain tree of links), so every import statement, top level or inside a function, is seen."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import dpda

ROOT = Path(__file__).resolve().parents[2]
# (package folder, import name) of the three top-level folders
FOLDERS = {
    "common": "dpda",
    "source_party": "dpda.source_party",
    "target_party": "dpda.target_party",
}
LINT = Path(sys.executable).with_name("lint-imports")
# the fewest import dependencies the contracts must see: fewer means it has stopped reading them
MIN_DEPENDENCIES = 1000


def _lint(package_parent: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on pyproject.toml's contracts; ``package_parent``: a folder holding a
    copy of the package, found before the installed one."""
    env = dict(os.environ)
    if package_parent is not None:
        env["PYTHONPATH"] = str(package_parent)
    return subprocess.run(
        [str(LINT), "--no-cache", "--no-logo", str(ROOT / "pyproject.toml")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_package_keeps_its_layers() -> None:
    got = _lint()
    assert got.returncode == 0, got.stdout + got.stderr
    assert "2 kept, 0 broken" in got.stdout, got.stdout
    deps = int(re.search(r"Analyzed \d+ files, (\d+) dependencies", got.stdout)[1])  # type: ignore[index]
    assert deps >= MIN_DEPENDENCIES, got.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("dp/upward.py", "from dpda.cli.main import main\n", "Layers"),
        ("source_party/across.py", "from dpda.target_party import client\n", "Layers"),
        ("ot/grpc_below.py", "def f():\n    import grpc\n", "third-party"),
    ],
)
def test_the_contracts_catch_a_forbidden_import(
    tmp_path: Path, module: str, line: str, broken: str
) -> None:
    """The check itself can fail: a copy of the package with one upward, cross-party or
    service-package import (inside a function for the last) breaks the contract it names."""
    shutil.copytree(Path(dpda.__file__).parent, tmp_path / "dpda", symlinks=False)
    (tmp_path / "dpda" / module).write_text(line)
    got = _lint(tmp_path)
    assert got.returncode != 0, got.stdout
    assert re.search(rf"{broken}.*BROKEN", got.stdout), got.stdout


@pytest.mark.parametrize("name", ["common", "source_party", "target_party"])
def test_only_the_dpda_package_is_installed(name: str) -> None:
    """pyproject installs one import package: every folder with an ``__init__.py`` is listed
    under its ``dpda`` name, and no top-level ``common``/``…_party`` package is declared."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    packages = set(cfg["packages"])
    assert all(p == "dpda" or p.startswith("dpda.") for p in packages)
    assert name not in packages
    declared = {
        ".".join([FOLDERS[f], *d.relative_to(ROOT / f).parts]).rstrip(".")
        for f in FOLDERS
        for d in [ROOT / f, *(p.parent for p in (ROOT / f).rglob("*/__init__.py"))]
    }
    assert declared == packages


def test_public_api_and_version(capsys: pytest.CaptureFixture[str]) -> None:
    import dpda
    from dpda.cli.main import main

    assert set(dpda.__all__) == {
        "AdaptConfig", "DPDAClassifier", "DPDASkadaEstimator", "SessionTerms", "__version__",
        "load_model", "read_table", "simulate",
    }  # fmt: skip
    assert dpda.SessionTerms.__module__ == "dpda.terms" and callable(dpda.simulate)
    for name in dpda.__all__:
        assert getattr(dpda, name) is not None  # each name resolves
    with pytest.raises(AttributeError):
        _ = dpda.releases  # internal modules are not part of the API
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"dpda {dpda.__version__}"


# commit ids and issue or seed numbers: history, which lives in git and in test names
HISTORY = re.compile(
    r"9ac3bc1|ec1cf18|issue [0-9]+|seed 00[0-9]"
    r"|\b(?:on|at|since|before|after|commit) [0-9a-f]{7,40}\b"
)


def test_the_package_says_what_is_not_how_it_came_to_be() -> None:
    """No commit id, issue or seed number in the package's code, help or docstrings (the
    generated protobuf code included: its comments come from proto/)."""
    for story in ("(on 3f2a9c1 it failed)", "see issue 12", "seed 001's setting"):
        assert HISTORY.search(story), story  # the check sees what it looks for
    found = []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py*")):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if HISTORY.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)


def test_the_package_points_at_design_pages_that_exist() -> None:
    """Every ``docs/….md`` a module names is a page of the site, and no module points at a
    design document outside the repository."""
    page = re.compile(r"docs/([\w/-]+\.md)")
    missing, outside = [], []
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text()
            missing += [
                f"{path.relative_to(ROOT)}: docs/{m}"
                for m in page.findall(text)
                if not (ROOT / "docs" / m).is_file()
            ]
            if "DESIGN.md" in text or "DESIGN §" in text:
                outside.append(str(path.relative_to(ROOT)))
    assert not missing, "\n".join(missing)
    assert not outside, "\n".join(outside)
