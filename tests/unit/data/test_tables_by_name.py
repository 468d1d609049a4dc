"""Tables are matched by their columns' names, and a labeled source needs two classes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpda.data.tables import align_columns, read_table
from dpda.errors import ConfigError
from dpda.service.config import SourceDataset
from dpda.source_party.app import load_dataset


def _csv(path: Path, header: list[str], rows: list[list[object]]) -> Path:
    path.write_text("\n".join(",".join(map(str, r)) for r in [header, *rows]) + "\n")
    return path


def test_the_same_names_in_another_order_are_reordered(tmp_path: Path) -> None:
    s = read_table(_csv(tmp_path / "s.csv", ["a", "b", "y"], [[1, 2, 0], [3, 4, 1]]), "y")
    t = read_table(
        _csv(tmp_path / "t.csv", ["b", "a"], [[20, 10], [40, 30]]), "y", labels="optional"
    )
    aligned = align_columns(t, s)
    assert aligned.columns == ("a", "b")
    assert aligned.x.tolist() == [[10.0, 20.0], [30.0, 40.0]]


def test_a_renamed_column_is_refused_naming_both(tmp_path: Path) -> None:
    s = read_table(_csv(tmp_path / "s.csv", ["a", "b", "y"], [[1, 2, 0], [3, 4, 1]]), "y")
    t = read_table(_csv(tmp_path / "t.csv", ["a", "B"], [[1, 2]]), "y", labels="optional")
    with pytest.raises(ConfigError, match=r"t\.csv.*lacks 'b' and has 'B'"):
        align_columns(t, s)


def test_files_without_headers_are_compared_by_width(tmp_path: Path) -> None:
    s = read_table(_csv(tmp_path / "s.csv", ["1", "2", "0"], [[3, 4, 1]]), -1)
    t = read_table(_csv(tmp_path / "t.csv", ["1", "2", "3"], []), None, labels="none")
    with pytest.raises(ConfigError, match="3 feature columns"):
        align_columns(t, s)


def test_the_source_daemon_refuses_a_table_of_one_class(tmp_path: Path) -> None:
    path = _csv(tmp_path / "one.csv", ["a", "b", "label"], [[1, 2, 5], [3, 4, 5], [0, 1, 5]])
    ds = SourceDataset(name="one", kind="table", path=path, label_column="label", epsilon=1.0)
    with pytest.raises(
        ConfigError, match=r"one\.csv.*'label'.*datasets\.one\.label_column.*one class \(5\)"
    ):
        load_dataset(ds)


def test_the_source_daemon_refuses_a_class_with_no_rows(tmp_path: Path) -> None:
    """Labels 0, 1 and 3: class 2 has no row, so its released mean would be noise alone.
    Refused when the daemon loads the dataset, before any peer asks (no peer learns it)."""
    rows = [[1, 2, 0], [3, 4, 1], [0, 1, 3], [2, 2, 0]]
    path = _csv(tmp_path / "gap.csv", ["a", "b", "label"], rows)
    ds = SourceDataset(name="gap", kind="table", path=path, label_column="label", epsilon=1.0)
    with pytest.raises(ConfigError, match=r"gap\.csv.*class 2 has no rows"):
        load_dataset(ds)
