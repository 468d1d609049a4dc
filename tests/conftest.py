from __future__ import annotations

import ast

import numpy as np
import pytest

from dpda.data.loaders import default_data_dir


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="session")
def data_dir():
    d = default_data_dir()
    if d is None or not (d / "office-caltech10-surf").is_dir():
        pytest.skip(
            "benchmark data not found: set DPDA_DATA or place ../shared/data beside the checkout"
        )
    return d


def _marked_slow(path) -> bool:
    """Whether the module's last first-level ``pytestmark`` is exactly ``pytest.mark.slow``
    (read from its syntax tree, not imported)."""
    mark = None
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            mark = ast.unparse(node.value)
    return mark == "pytest.mark.slow"


def pytest_ignore_collect(collection_path, config: pytest.Config) -> bool | None:
    """The fast loop (``-m "not slow"``) does not import a module none of whose tests it would
    select: those under tests/integration (every test there is ``slow``, below) and a module
    marked ``slow`` as a whole (its first-level ``pytestmark`` is ``pytest.mark.slow``, read
    from its syntax tree)."""
    if config.getoption("markexpr", "").strip() != "not slow":
        return None
    if "integration" in collection_path.parts:
        return True
    if collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if _marked_slow(collection_path):
            return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test under tests/integration runs real daemons (processes, TLS handshakes, SQLite
    fsyncs): it counts as ``slow``, so ``pytest -m "not slow"`` is the fast loop."""
    for item in items:
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.slow)
