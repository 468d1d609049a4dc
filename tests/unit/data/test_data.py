"""Loaders and the 1-NN baselines of DESIGN.md §8 (JDA paper, to two decimals)."""

from __future__ import annotations

import numpy as np
import pytest

from dpda.data.loaders import load_domain, load_table
from dpda.data.preprocessing import l2_normalize, row_normalize, zscore_own
from dpda.data.synthetic import two_domains
from dpda.data.tables import read_table, write_predictions
from dpda.errors import ConfigError
from dpda.target_party.training import accuracy, fit_predict

pytestmark = pytest.mark.data


@pytest.mark.parametrize(
    "s,t,expected", [("C", "A", 23.70), ("A", "C", 26.00), ("D", "W", 63.39), ("W", "D", 59.24)]
)
def test_office_caltech_1nn_baselines(data_dir, s: str, t: str, expected: float) -> None:
    src = load_domain(data_dir, "office-caltech", s)
    tgt = load_domain(data_dir, "office-caltech", t)
    assert src.x.shape[1] == 800 and src.y.min() == 0 and src.y.max() == 9
    _, pred = fit_predict(zscore_own(row_normalize(src.x)), src.y, zscore_own(row_normalize(tgt.x)))
    assert round(accuracy(pred, tgt.y), 2) == expected


@pytest.mark.parametrize("s,t,expected", [("U", "M", 44.70), ("M", "U", 65.94)])
def test_digits_1nn_baselines(data_dir, s: str, t: str, expected: float) -> None:
    src = load_domain(data_dir, "mnist-usps", s)
    tgt = load_domain(data_dir, "mnist-usps", t)
    _, pred = fit_predict(l2_normalize(src.x), src.y, l2_normalize(tgt.x))
    assert round(accuracy(pred, tgt.y), 2) == expected


def test_domain_sizes(data_dir) -> None:
    sizes = {d: load_domain(data_dir, "office-caltech", d).x.shape[0] for d in "ACDW"}
    assert sizes == {"A": 958, "C": 1123, "D": 157, "W": 295}


def test_unknown_domain_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(ValueError, match="unknown office-caltech domain"):
        load_domain(tmp_path, "office-caltech", "Z")
    with pytest.raises(FileNotFoundError):
        load_domain(tmp_path, "office-caltech", "A")


def test_tables_roundtrip(tmp_path) -> None:
    s, _ = two_domains(n_source=50, n_target=10)
    arr = np.hstack([s.x, s.y[:, None]])
    np.save(tmp_path / "d.npy", arr)
    np.savetxt(tmp_path / "d.csv", arr, delimiter=",")
    for name in ("d.npy", "d.csv"):
        d = load_table(tmp_path / name)
        assert np.allclose(d.x, s.x) and np.array_equal(d.y, s.y)
    bad = arr.copy()
    bad[0, -1] = 0.5
    np.save(tmp_path / "bad.npy", bad)
    with pytest.raises(
        ConfigError, match=r"bad.npy: column 'x40', row 0: label 0.5 is not a non-neg"
    ):
        load_table(tmp_path / "bad.npy")


def _csv(path, header, rows) -> None:
    path.write_text("\n".join([",".join(header), *(",".join(map(str, r)) for r in rows)]) + "\n")


def test_a_csv_with_a_header_the_label_by_name_and_an_unlabeled_target(tmp_path) -> None:
    _csv(tmp_path / "s.csv", ["id", "f0", "f1", "label"], [["a", 1.5, 2, 0], ["b", 3, 4.25, 2]])
    _csv(tmp_path / "t.csv", ["id", "f0", "f1"], [["u", 1, 2], ["v", 3, 4], ["w", 5, 6]])
    s = read_table(tmp_path / "s.csv", "label", id_column="id")
    assert s.columns == ("f0", "f1") and s.x.tolist() == [[1.5, 2.0], [3.0, 4.25]]
    assert s.y is not None and s.y.tolist() == [0, 2] and s.domain.n_classes == 3
    assert s.ids.tolist() == ["a", "b"]
    t = read_table(tmp_path / "t.csv", "label", labels="optional", id_column="id")
    assert t.y is None and t.x.shape == (3, 2) and t.domain.n_classes == 0
    with pytest.raises(ConfigError, match=r"t.csv: no label column 'label'"):
        read_table(tmp_path / "t.csv", "label")  # a source's labels are required
    with pytest.raises(ConfigError, match="has no labels"):
        t.domain.labels()


def test_input_errors_name_the_file_the_column_and_the_line(tmp_path) -> None:
    _csv(tmp_path / "s.csv", ["f0", "f1", "label"], [[1, 2, 0], [3, "oops", 1]])
    with pytest.raises(ConfigError, match=r"s.csv: column 'f1', line 3: 'oops' is not a number"):
        read_table(tmp_path / "s.csv", "label")
    _csv(tmp_path / "n.csv", ["f0", "label"], [[1, 0], ["nan", 1]])
    with pytest.raises(ConfigError, match=r"n.csv: column 'f0', line 3: 'nan' is not finite"):
        read_table(tmp_path / "n.csv", "label")
    _csv(tmp_path / "r.csv", ["f0", "label"], [[1, 0], [2]])
    with pytest.raises(ConfigError, match=r"r.csv: line 3 has 1 columns, the table 2"):
        read_table(tmp_path / "r.csv", "label")
    with pytest.raises(ConfigError, match=r"x.txt: unknown table format"):
        (tmp_path / "x.txt").write_text("1,2\n")
        read_table(tmp_path / "x.txt")
    with pytest.raises(ConfigError, match="no such file"):
        read_table(tmp_path / "missing.csv")


def test_npz_parquet_and_dataframes_read_the_same_rows(tmp_path) -> None:
    pd = pytest.importorskip("pandas")
    pytest.importorskip("pyarrow")
    x = np.array([[0.5, 1.0], [2.0, -3.0], [4.0, 5.0]])
    y = np.array([1, 0, 1])
    np.savez(tmp_path / "d.npz", x=x, y=y)
    frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1], "cls": y})
    frame.to_parquet(tmp_path / "d.parquet")
    for t in (
        read_table(tmp_path / "d.npz", "y"),
        read_table(tmp_path / "d.parquet", "cls"),
        read_table(frame, "cls"),
    ):
        assert np.array_equal(t.x, x) and t.y is not None and np.array_equal(t.y, y)
    out = write_predictions(tmp_path / "p.parquet", np.array(["r1", "r2", "r3"]), y)
    back = pd.read_parquet(out)
    assert back["id"].tolist() == ["r1", "r2", "r3"] and back["prediction"].tolist() == [1, 0, 1]


def test_a_column_named_id_is_the_id_column_unless_one_is_given(tmp_path) -> None:
    _csv(tmp_path / "t.csv", ["ID", "f0", "f1"], [["u", 1, 2], ["v", 3, 4]])
    t = read_table(tmp_path / "t.csv", "label", labels="optional")
    assert t.columns == ("f0", "f1") and t.ids.tolist() == ["u", "v"]
    _csv(tmp_path / "n.csv", ["id", "f0", "label"], [[7, 1, 0], [8, 3, 1]])
    n = read_table(tmp_path / "n.csv", "label", id_column="f0")  # given: id stays a feature
    assert n.columns == ("id",) and n.ids.tolist() == ["1", "3"]
