"""A user's own tables: CSV (with or without a header), Parquet, ``.npy``/``.npz`` and pandas
DataFrames, with the label column by name or position and labels optional (a target's).

Every input error is a ``ConfigError`` that names the file, the column and the row (CSV: the
line of the file) — public facts about one's own file, never sent to a peer.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dpda.data.loaders import Domain
from dpda.errors import ConfigError

Column = str | int | None  # a name, a position (negative counts from the end), or none

FORMATS = (".csv", ".parquet", ".npy", ".npz")
ID_NAMES = ("id", "row_id", "rowid", "row id")  # header names taken as the id column


@dataclass(frozen=True)
class Table:
    """One party's rows: features, labels when it has them, and the ids predictions keep."""

    domain: Domain
    ids: np.ndarray  # (n,) the id column's values, else row numbers 0..n-1
    columns: tuple[str, ...]  # feature names (``x0``… when the file has none)
    where: str  # the file (or "DataFrame"), for messages
    named: bool = False  # the columns' names come from the file (a header), not ``x0``…
    label_names: tuple[str, ...] | None = None  # string labels: the name of class 0, 1, …

    @classmethod
    def of(cls, domain: Domain) -> Table:
        """A table of a benchmark domain: row numbers as ids, ``x0``… as column names."""
        k = domain.x.shape[1]
        return cls(domain, np.arange(domain.x.shape[0]), tuple(f"x{j}" for j in range(k)), "")

    @property
    def x(self) -> np.ndarray:
        return self.domain.x

    @property
    def y(self) -> np.ndarray | None:
        return self.domain.y


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _read_csv(path: Path) -> tuple[list[str] | None, list[list[str]], int]:
    """(header or None, rows, line number of the first row)."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = [r for r in csv.reader(fh) if r and any(c.strip() for c in r)]
    if not rows:
        raise ConfigError(f"{path}: the file is empty")
    first = [c.strip() for c in rows[0]]
    if all(_is_number(c) for c in first):
        return None, rows, 1
    return first, rows[1:], 2


def _read_parquet(path: Path) -> Any:
    """The Parquet file at ``path`` as a pandas frame (the ``data`` extra)."""
    try:
        import pandas as pd

        return pd.read_parquet(path)
    except ImportError:
        raise ConfigError(
            f"{path}: reading Parquet needs pandas and pyarrow: pip install 'dpda[data]'"
        ) from None


def _frame_columns(frame: Any, where: str) -> tuple[list[str], list[list[Any]]]:
    names = [str(c) for c in frame.columns]
    return names, frame.itertuples(index=False, name=None)


def _raw(source: Any, where: str) -> tuple[list[str] | None, list[list[Any]], int, str]:
    """(column names or None, rows as lists, first row's number, the unit rows are counted in)."""
    if hasattr(source, "columns") and hasattr(source, "itertuples"):  # a pandas DataFrame
        names, rows = _frame_columns(source, where)
        return names, [list(r) for r in rows], 0, "row"
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"{path}: no such file")
    suffix = path.suffix.lower()
    if suffix == ".csv":
        header, rows, first = _read_csv(path)
        return header, rows, first, "line"
    if suffix == ".parquet":
        names, rows = _frame_columns(_read_parquet(path), where)
        return names, [list(r) for r in rows], 0, "row"
    if suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
        if arr.ndim != 2:
            raise ConfigError(f"{path}: a .npy table must be 2-D (rows × columns), not {arr.shape}")
        return None, arr.tolist(), 0, "row"
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as z:
            keys = set(z.files)
            xk = "x" if "x" in keys else "X" if "X" in keys else None
            if xk is None:
                raise ConfigError(f"{path}: a .npz table holds 'x' (and 'y' if labeled)")
            x = np.asarray(z[xk])
            if x.ndim != 2:
                raise ConfigError(f"{path}: 'x' must be 2-D (rows × features), not {x.shape}")
            cols = [f"x{j}" for j in range(x.shape[1])]
            rows = x.tolist()
            if "y" in keys:
                y = np.asarray(z["y"]).ravel()
                if y.shape[0] != x.shape[0]:
                    raise ConfigError(f"{path}: 'y' has {y.shape[0]} rows, 'x' {x.shape[0]}")
                cols.append("y")
                rows = [[*r, v] for r, v in zip(rows, y.tolist(), strict=True)]
            return cols, rows, 0, "row"
    raise ConfigError(f"{path}: unknown table format {suffix!r} (use one of {', '.join(FORMATS)})")


def _columnar(source: Any, where: str) -> tuple[list[str] | None, list[np.ndarray]] | None:
    """(column names or None, one array per column) for the formats that store columns
    (a DataFrame, Parquet, ``.npy``, ``.npz``); None for CSV, read row by row. Reading by
    column keeps the table's memory a few bytes a cell (a Python object per cell costs tens)."""
    if hasattr(source, "columns") and hasattr(source, "itertuples"):  # a pandas DataFrame
        frame = source
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"{path}: no such file")
        suffix = path.suffix.lower()
        if suffix == ".parquet":
            frame = _read_parquet(path)
        elif suffix == ".npy":
            arr = np.load(path, allow_pickle=False)
            if arr.ndim != 2:
                raise ConfigError(
                    f"{path}: a .npy table must be 2-D (rows × columns), not {arr.shape}"
                )
            return None, [arr[:, j] for j in range(arr.shape[1])]
        elif suffix == ".npz":
            with np.load(path, allow_pickle=False) as z:
                keys = set(z.files)
                xk = "x" if "x" in keys else "X" if "X" in keys else None
                if xk is None:
                    raise ConfigError(f"{path}: a .npz table holds 'x' (and 'y' if labeled)")
                x = np.asarray(z[xk])
                if x.ndim != 2:
                    raise ConfigError(f"{path}: 'x' must be 2-D (rows × features), not {x.shape}")
                cols = [x[:, j] for j in range(x.shape[1])]
                names = [f"x{j}" for j in range(x.shape[1])]
                if "y" in keys:
                    y = np.asarray(z["y"]).ravel()
                    if y.shape[0] != x.shape[0]:
                        raise ConfigError(f"{path}: 'y' has {y.shape[0]} rows, 'x' {x.shape[0]}")
                    cols.append(y)
                    names.append("y")
                return names, cols
        elif suffix == ".csv":
            return None
        else:
            return None  # _raw names the unknown format
    names = [str(c) for c in frame.columns]
    return names, [frame.iloc[:, j].to_numpy() for j in range(len(names))]


def _numbers(values: Any, where: str, column: str, unit: str, first: int) -> np.ndarray:
    """A column as float64; the first value that is not a finite number is refused as
    ``_number`` refuses it (naming the column and the row)."""
    arr = values if isinstance(values, np.ndarray) else None
    if arr is not None and arr.dtype.kind in "iufb":
        v = arr.astype(np.float64)
        bad = ~np.isfinite(v)
        if bad.any():
            i = int(np.argmax(bad))
            _number(arr[i].item(), where, column, unit, first + i)
        return v
    return np.array(
        [_number(v, where, column, unit, first + i) for i, v in enumerate(values)],
        dtype=np.float64,
    )


def _position(column: str | int, names: list[str] | None, width: int, where: str) -> int | None:
    """The column's index; None if it is named and absent."""
    if isinstance(column, int) and not isinstance(column, bool):
        if not -width <= column < width:
            raise ConfigError(f"{where}: column {column} is out of range ({width} columns)")
        return column % width
    if names is None:
        if str(column).lstrip("-").isdigit():
            return _position(int(column), None, width, where)
        raise ConfigError(f"{where}: column {column!r} is named but the file has no header")
    return names.index(str(column)) if str(column) in names else None


def read_table(
    source: Any,
    label_column: Column = -1,
    *,
    labels: str = "required",
    id_column: str | None = None,
    name: str | None = None,
) -> Table:
    """Read one party's table.

    ``label_column``: a name or a position (``None``: the table has no labels). ``labels``:
    ``required`` (a source), ``optional`` (a target: a *named* label column may be absent;
    present, it is read for evaluation only) or ``none`` (every column is a feature).
    ``id_column``: a column kept as row ids (not a feature); without one, a header column named
    ``id`` or ``row_id`` is taken as it. Labels are class indices (0, 1, …) or names (any text:
    classes in sorted order, ``label_names``).

    Parameters
    ----------
    source : str, pathlib.Path or pandas.DataFrame
        The table: a ``.csv`` file (with or without a header), ``.parquet`` (needs pandas
        and pyarrow), ``.npy`` (a 2-D array, no column names), ``.npz`` (features ``x`` or
        ``X``, labels ``y`` if any; columns named ``x0``, ``x1``, …, ``y``) or a DataFrame.
    label_column : str, int or None, default -1
        The label column, by name or by position (negative counts from the end); None: the
        table has no labels. The default is the last column.
    labels : {'required', 'optional', 'none'}, default 'required'
        ``required`` (a source's table): a label column that is absent is refused;
        ``optional`` (a target's): a named label column may be absent, and one that is
        present is read for evaluation only; ``none``: no column is read as labels.
    id_column : str or None, default None
        A column, by name, kept as the row ids and not as a feature. None: a header column
        named ``id``, ``row_id``, ``rowid`` or ``row id`` (any case) is taken as it, unless it
        is the label column; without one the ids are the row numbers 0, 1, ….
    name : str or None, default None
        The table's name. None: the file's stem (``table`` for a DataFrame).

    Returns
    -------
    Table
        The features (every column but the label and id columns, as float64), the labels as
        class indices (None without a label column), the row ids, the feature names (``x0``,
        ``x1``, … without a header) and, for text labels, the class names (``label_names``).

    Raises
    ------
    ConfigError
        A file that is missing or of another format, a table with no rows or no feature
        column, a column that is absent or out of range, a cell that is not a finite number
        or a numeric label that is not a class index; each names its file, column and row.
    """
    where = "DataFrame" if hasattr(source, "columns") else str(source)
    columnar = _columnar(source, where)
    if columnar is not None:
        names, columns = columnar
        first, unit = 0, "row"
        n_rows = len(columns[0]) if columns else 0
        width = len(columns)

        def column(j: int) -> Any:
            return columns[j]
    else:
        names, rows, first, unit = _raw(source, where)
        n_rows = len(rows)
        width = len(names) if names is not None else (len(rows[0]) if rows else 0)
        for i, r in enumerate(rows):
            if len(r) != width:
                raise ConfigError(
                    f"{where}: {unit} {first + i} has {len(r)} columns, the table {width}"
                )

        def column(j: int) -> Any:
            return [r[j] for r in rows]

    if not n_rows:
        raise ConfigError(f"{where}: the table has no rows")
    label_at = None
    if labels != "none" and label_column is not None:
        label_at = _position(label_column, names, width, where)
        if label_at is None and labels == "required":
            raise ConfigError(f"{where}: no label column {label_column!r} (columns: {names})")
    if id_column is None and names is not None:
        # a column named like an id names rows, it is not a feature: taken as the id column
        # unless one is given (a row id as a feature would only add noise to the transport)
        id_column = next((c for c in names if c.strip().lower() in ID_NAMES), None)
        if id_column is not None and id_column == (
            names[label_at] if label_at is not None else None
        ):
            id_column = None
    id_at = None
    if id_column is not None:
        id_at = _position(id_column, names, width, where)
        if id_at is None:
            raise ConfigError(f"{where}: no id column {id_column!r} (columns: {names})")
    feature_at = [j for j in range(width) if j not in (label_at, id_at)]
    if not feature_at:
        raise ConfigError(f"{where}: the table has no feature columns")
    col_names = [names[j] if names else f"x{j}" for j in range(width)]
    x = np.empty((n_rows, len(feature_at)), dtype=np.float64)
    for i in range(n_rows) if columnar is None else ():  # CSV: row by row, the first bad cell
        for k, j in enumerate(feature_at):
            x[i, k] = _number(rows[i][j], where, col_names[j], unit, first + i)
    for k, j in enumerate(feature_at) if columnar is not None else ():
        x[:, k] = _numbers(column(j), where, col_names[j], unit, first)
    y = None
    label_names = None
    if label_at is not None:
        raw = column(label_at)
        if isinstance(raw, np.ndarray) and raw.dtype.kind in "iuf":  # class indices 0, 1, …
            v = _numbers(raw, where, col_names[label_at], unit, first)
            bad = (v < 0) | (v != np.round(v))
            if bad.any():
                i = int(np.argmax(bad))
                _label(raw[i].item(), where, col_names[label_at], unit, first + i)
            y = v.astype(np.int64)
        elif all(_is_number(str(v)) for v in raw):  # class indices 0, 1, …
            y = np.array(
                [_label(v, where, col_names[label_at], unit, first + i) for i, v in enumerate(raw)],
                dtype=np.int64,
            )
        else:  # names: classes in sorted order, mapped back in the predictions
            text = [str(v).strip() for v in raw]
            label_names = tuple(sorted(set(text)))
            index = {name: c for c, name in enumerate(label_names)}
            y = np.array([index[t] for t in text], dtype=np.int64)
    ids = np.asarray(column(id_at)) if id_at is not None else np.arange(n_rows)
    stem = name or (Path(where).stem if where != "DataFrame" else "table")
    n_classes = (len(label_names) if label_names else int(y.max()) + 1) if y is not None else 0
    features = tuple(col_names[j] for j in feature_at)
    domain = Domain(stem, x, y, n_classes)
    return Table(domain, ids, features, where, names is not None, label_names)


def align_labels(table: Table, reference: Table) -> Table:
    """``table``'s labels (a target's, for scoring) as ``reference``'s classes: by name when the
    reference's labels are names; a name the reference has not is refused, naming it."""
    if reference.label_names is None or table.y is None:
        return table
    names = table.label_names or tuple(str(c) for c in range(int(table.y.max()) + 1))
    index = {name: c for c, name in enumerate(reference.label_names)}
    unknown = sorted({names[c] for c in np.unique(table.y)} - set(index))
    if unknown:
        raise ConfigError(
            f"{table.where}: labels {', '.join(map(repr, unknown))} are no class of "
            f"{reference.where or 'the source'} ({', '.join(map(repr, reference.label_names))})"
        )
    y = np.array([index[names[c]] for c in table.y], dtype=np.int64)
    d = table.domain
    domain = Domain(d.name, d.x, y, len(reference.label_names))
    return Table(domain, table.ids, table.columns, table.where, table.named, reference.label_names)


def align_columns(table: Table, reference: Table) -> Table:
    """``table`` with its feature columns in the order of ``reference``'s, matched by name.

    Headers decide, never positions: the same names in another order are reordered; a name that
    differs is refused, naming the columns on both sides. Without names on both sides (a file
    with no header, a ``.npy``) only the widths are compared.
    """
    columns, ref = reference.columns, reference.where or "the source"
    named = (
        table.named
        and reference.named
        and len(set(table.columns)) == len(table.columns)
        and len(set(columns)) == len(columns)
    )
    if not named:
        if len(table.columns) != len(columns):
            raise ConfigError(
                f"{table.where}: {len(table.columns)} feature columns, {ref} {len(columns)}"
            )
        return table
    if table.columns == columns:
        return table
    missing = [c for c in columns if c not in table.columns]
    extra = [c for c in table.columns if c not in columns]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"lacks {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"has {', '.join(map(repr, extra))}, which {ref} has not")
        raise ConfigError(
            f"{table.where}: its feature columns differ from {ref}'s: it "
            + " and ".join(parts)
            + " (columns are matched by their header names; rename them to agree)"
        )
    order = [table.columns.index(c) for c in columns]
    d = table.domain
    domain = Domain(d.name, d.x[:, order], d.y, d.n_classes)
    return Table(domain, table.ids, columns, table.where, True)


# rows a class needs: the release describes classes 0…q−1, and one with no row is noise alone
MIN_CLASS_ROWS = 1


def check_classes(table: Table, label_column: str, field: str = "") -> None:
    """Refuse labels that hold fewer than two classes: nothing is learnt from one class, and
    every prediction would be that class. ``field``: the config field that names the column."""
    y = table.y
    if y is None:
        return
    present = np.unique(y)
    if present.size < 2:
        at = f" ({field})" if field else ""
        raise ConfigError(
            f"{table.where}: column {label_column!r}{at} holds one class ({int(present[0])}) in "
            f"all {y.size} rows; a source needs labeled rows of at least two classes"
        )
    counts = np.bincount(np.asarray(y, dtype=np.int64))
    empty = np.flatnonzero(counts < MIN_CLASS_ROWS)
    if empty.size:
        at = f" ({field})" if field else ""
        raise ConfigError(
            f"{table.where}: column {label_column!r}{at}: class {int(empty[0])} has no rows "
            f"(labels run 0…{counts.size - 1}); every class a release describes needs at least "
            f"{MIN_CLASS_ROWS} row, or its noisy mean is noise alone: number the classes "
            "0, 1, … without gaps"
        )


def _number(value: Any, where: str, column: str, unit: str, at: int) -> float:
    try:
        v = float(value.strip() if isinstance(value, str) else value)
    except (TypeError, ValueError):
        raise ConfigError(
            f"{where}: column {column!r}, {unit} {at}: {value!r} is not a number (a column "
            "that names rows is the id column: --id-column / id_column)"
        ) from None
    if not math.isfinite(v):
        raise ConfigError(f"{where}: column {column!r}, {unit} {at}: {value!r} is not finite")
    return v


def _label(value: Any, where: str, column: str, unit: str, at: int) -> int:
    v = _number(value, where, column, unit, at)
    if v < 0 or v != round(v):
        raise ConfigError(
            f"{where}: column {column!r}, {unit} {at}: label {value!r} is not a non-negative "
            "integer (class labels are 0, 1, …)"
        )
    return int(v)


def write_predictions(
    path: str | Path,
    ids: np.ndarray,
    predictions: np.ndarray,
    label_names: tuple[str, ...] | None = None,
) -> Path:
    """Predictions with the rows' ids: CSV (``id,prediction``) or Parquet, by the suffix.
    ``label_names``: the source's labels were names; class ``c`` is written as its name."""
    path = Path(path)
    if label_names is not None:
        predictions = np.asarray(label_names, dtype=object)[np.asarray(predictions, dtype=int)]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".parquet":
        try:
            import pandas as pd
        except ImportError:
            raise ConfigError(
                f"{path}: writing Parquet needs pandas: pip install 'dpda[data]'"
            ) from None
        pd.DataFrame({"id": ids, "prediction": predictions}).to_parquet(path, index=False)
        return path
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["id", "prediction"])
        w.writerows(zip(ids.tolist(), np.asarray(predictions).tolist(), strict=True))
    return path
