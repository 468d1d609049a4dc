"""Tables with columns (Parquet, .npy, .npz, DataFrames) are read a column at a time: the same
table as row by row, and the same refusals, naming the column and the row."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from dpda.data.tables import read_table
from dpda.errors import ConfigError


def _frame(n: int = 12) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    cols = {f"f{j}": rng.normal(size=n).astype(np.float32) for j in range(3)}
    return pd.DataFrame({**cols, "label": rng.integers(0, 3, n)})


def test_parquet_npy_and_csv_read_the_same_table(tmp_path) -> None:
    df = _frame()
    df.to_parquet(tmp_path / "t.parquet", index=False)
    df.to_csv(tmp_path / "t.csv", index=False)
    np.save(tmp_path / "t.npy", df.to_numpy(dtype=np.float64))
    pq = read_table(tmp_path / "t.parquet", "label")
    csv = read_table(tmp_path / "t.csv", "label")
    npy = read_table(tmp_path / "t.npy", -1)
    np.testing.assert_allclose(pq.x, csv.x, rtol=1e-6)  # the CSV holds decimal text
    np.testing.assert_array_equal(pq.x, npy.x)
    np.testing.assert_array_equal(pq.y, csv.y)
    np.testing.assert_array_equal(pq.y, npy.y)
    assert pq.x.dtype == np.float64 and pq.columns == ("f0", "f1", "f2")


@pytest.mark.parametrize(
    ("column", "row", "value", "message"),
    [
        ("f1", 7, np.nan, r"column 'f1', row 7: nan is not finite"),
        ("f0", 0, np.inf, r"column 'f0', row 0: inf is not finite"),
        ("label", 3, 2.5, r"column 'label', row 3: label 2.5 is not a non-negative integer"),
        ("label", 5, -1, r"column 'label', row 5: label -1(\.0)? is not a non-negative integer"),
    ],
)
def test_a_bad_cell_is_refused_naming_its_column_and_row(column, row, value, message) -> None:
    df = _frame()
    if column == "label":
        df[column] = df[column].astype(np.float64)
    df.loc[row, column] = value
    with pytest.raises(ConfigError, match=message):
        read_table(df, "label")


def test_text_in_a_column_is_refused_as_before() -> None:
    df = _frame().astype({"f2": object})
    df.loc[4, "f2"] = "n/a"
    with pytest.raises(ConfigError, match=r"column 'f2', row 4: 'n/a' is not a number"):
        read_table(df, "label")
