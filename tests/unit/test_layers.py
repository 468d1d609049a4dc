"""The package's layers (issue 14): a module imports only from its own layer or the layers below
it, and the two parties never import each other. docs/architecture.md lists the same
order. The check reads every import statement (top level or inside a function) with ``ast``."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# (package folder, import name) of the three top-level folders
FOLDERS = {
    "common": "dpda",
    "source_party": "dpda.source_party",
    "target_party": "dpda.target_party",
}

# lowest first; a module may import its own layer and any layer before it
LAYERS: list[list[str]] = [
    ["dpda.pb", "dpda.errors", "dpda.version"],
    ["dpda.dp", "dpda.ot", "dpda.data"],
    ["dpda.terms", "dpda.planner", "dpda.public_source_terms", "dpda.policy", "dpda.protocol"],
    ["dpda.service"],
    ["dpda.source_party", "dpda.target_party"],
    ["dpda.simulation", "dpda.deployment", "dpda.estimator", "dpda.skada_adapter"],
    ["dpda.bench"],
    ["dpda.cli", "dpda"],
]
# same layer, yet never one from the other
APART = [("dpda.source_party", "dpda.target_party"), ("dpda.target_party", "dpda.source_party")]


def _unit(module: str) -> str:
    """The layer entry a module belongs to (the longest matching prefix)."""
    best = ""
    for layer in LAYERS:
        for unit in layer:
            if (module == unit or module.startswith(unit + ".")) and len(unit) > len(best):
                best = unit
    assert best, f"{module} is in no layer: add it to LAYERS (and docs/architecture.md)"
    return best


def _rank(unit: str) -> int:
    return next(i for i, layer in enumerate(LAYERS) if unit in layer)


def _modules() -> list[tuple[str, Path]]:
    out = []
    for folder, name in FOLDERS.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            if parts and parts[0] == "pb":
                continue  # generated
            out.append((".".join([name, *parts]), path))
    return out


def _imports(module: str, path: Path, ours: bool = True) -> list[str]:
    """Every name ``module`` imports (``from X import a`` gives ``X`` and ``X.a``); ``ours``:
    only those of the dpda package."""
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
            else:
                target = node.module or ""
            found.append(target)
            found += [f"{target}.{a.name}" for a in node.names]  # `from dpda import cli`
    if not ours:
        return found
    return [f for f in found if f == "dpda" or f.startswith("dpda.")]


def _is_module(name: str) -> bool:
    for folder, pkg in sorted(FOLDERS.items(), key=lambda kv: -len(kv[1])):
        if name == pkg or name.startswith(pkg + "."):
            rest = name[len(pkg) :].lstrip(".").split(".") if name != pkg else []
            p = ROOT / folder / Path(*rest) if rest else ROOT / folder
            return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()
    return False


def _names_a_member(name: str) -> bool:
    """``X.a`` where X is a module that defines or imports ``a`` at its top level."""
    parent, _, attr = name.rpartition(".")
    if not _is_module(parent):
        return False
    for folder, pkg in sorted(FOLDERS.items(), key=lambda kv: -len(kv[1])):
        if parent == pkg or parent.startswith(pkg + "."):
            rest = parent[len(pkg) :].lstrip(".").split(".") if parent != pkg else []
            base = ROOT / folder / Path(*rest) if rest else ROOT / folder
            path = (
                base.with_suffix(".py")
                if base.with_suffix(".py").is_file()
                else base / "__init__.py"
            )
            return attr in _top_level_names(path)
    return False


def _top_level_names(path: Path) -> set[str]:
    return _bound_names(ast.parse(path.read_text()).body)


def _bound_names(body: list[ast.stmt]) -> set[str]:
    """The names a block of statements binds, into ``if`` and ``try`` blocks."""
    names: set[str] = set()
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        elif isinstance(node, ast.If):
            names |= _bound_names(node.body) | _bound_names(node.orelse)
        elif isinstance(node, ast.Try):
            names |= _bound_names(node.body) | _bound_names(node.orelse)
            for handler in node.handlers:
                names |= _bound_names(handler.body)
    return names


# the fewest module imports the check must see: fewer means it has stopped reading them
MIN_CHECKED = 550
# third-party packages of the service layer and above: the math below it runs without them
SERVICE_ONLY = ("grpc", "grpc_health", "sqlite3", "fastapi", "starlette", "uvicorn")


def test_no_module_imports_a_higher_layer() -> None:
    """Every dpda import is resolved (a module, or a name defined in the module it comes from)
    and checked; an import that resolves to neither fails the test rather than being
    skipped."""
    bad, unresolved, checked = [], [], 0
    for module, path in _modules():
        mine = _unit(module)
        for target in _imports(module, path):
            if not _is_module(target):
                if not _names_a_member(target):
                    unresolved.append(f"{module} imports {target}")
                continue  # `from X import name`: X itself is in the list and checked
            checked += 1
            theirs = _unit(target)
            if _rank(theirs) > _rank(mine) or (mine, theirs) in APART:
                bad.append(f"{module} imports {target} ({mine} may not import {theirs})")
    assert not unresolved, "\n".join(unresolved)
    assert not bad, "\n".join(bad)
    assert checked >= MIN_CHECKED, checked


def test_no_layer_below_the_service_imports_its_third_party_packages() -> None:
    """grpc, SQLite and the web stack stay in ``dpda.service`` and above: the privacy math,
    the transport and the data loaders run (and are tested) without them."""
    service = _rank("dpda.service")
    bad = [
        f"{module} imports {name}"
        for module, path in _modules()
        if _rank(_unit(module)) < service
        for name in _imports(module, path, ours=False)
        if name.split(".")[0] in SERVICE_ONLY
    ]
    assert not bad, "\n".join(bad)


def test_the_layer_check_catches_an_upward_import(tmp_path: Path) -> None:
    """The check itself can fail: an upward and a cross-party import are both seen."""
    path = tmp_path / "x.py"
    path.write_text("from dpda.cli.main import main\nfrom ..target_party import client\n")
    got = _imports("dpda.source_party.x", path)
    assert "dpda.cli.main" in got and "dpda.target_party.client" in got
    assert _rank(_unit("dpda.cli.main")) > _rank(_unit("dpda.source_party.x"))
    assert ("dpda.source_party", _unit("dpda.target_party.client")) in APART
    # and it fails closed: a name that is neither a module nor defined in one is unresolved
    assert _names_a_member("dpda.dp.accounting.epsilon_of")
    assert not _names_a_member("dpda.dp.accounting.no_such_name")
    assert not _is_module("dpda.no_such_module") and not _names_a_member("dpda.no_such_module.x")


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


def test_the_typing_link_tree_is_complete() -> None:
    """``python -m mypy`` reads the package through ``.ci/typing/dpda`` (mypy cannot follow the
    editable import hook): one link per entry of common/, plus the two parties, none stale."""
    tree = ROOT / ".ci" / "typing" / "dpda"
    want = {p.name for p in (ROOT / "common").iterdir() if p.name != "__pycache__"}
    want -= {"README.md"}  # for readers of the folder, not part of the package
    want |= {"source_party", "target_party"}
    have = {p.name for p in tree.iterdir()}
    assert have == want, f"add or remove links in {tree}: {sorted(want ^ have)}"
    for name in have:
        link = tree / name
        assert link.is_symlink() and link.resolve().exists(), name


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
