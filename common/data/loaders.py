"""Loaders for the public benchmark features (read-only, never copied) and generic files.

Paths come from ``--data-dir`` or the ``DPDA_DATA`` environment variable. Labels are returned
0-based (``int64``), features as ``float64``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

OFFICE_FILES = {
    "A": "amazon_SURF_L10.mat",
    "C": "Caltech10_SURF_L10.mat",
    "D": "dslr_SURF_L10.mat",
    "W": "webcam_SURF_L10.mat",
}
DIGIT_KEYS = {"M": ("X_mnist", "y_mnist"), "U": ("X_usps", "y_usps")}
DATASETS = {"office-caltech": tuple(OFFICE_FILES), "mnist-usps": tuple(DIGIT_KEYS)}


@dataclass(frozen=True)
class Domain:
    name: str
    x: np.ndarray  # (n, k) raw features
    y: np.ndarray | None  # (n,) labels in [0, q); None: unlabeled (a target's own data)
    n_classes: int  # 0 when unlabeled

    def labels(self) -> np.ndarray:
        """The labels; a clear error for an unlabeled table where labels are needed."""
        if self.y is None:
            from dpda.errors import ConfigError

            raise ConfigError(f"{self.name}: this table has no labels, and they are needed here")
        return self.y


def default_data_dir() -> Path | None:
    """``$DPDA_DATA``, else ``../shared/data`` next to the checkout if it exists."""
    env = os.environ.get("DPDA_DATA")
    if env:
        return Path(env)
    here = Path(__file__).resolve().parents[2]
    for cand in (here.parent / "shared" / "data", here / "shared" / "data"):
        if cand.is_dir():
            return cand
    return None


def require_data_dir(given: str | Path | None) -> Path:
    """``--data-dir`` if given, else the default; a clear error naming the flag if neither."""
    from dpda.errors import ConfigError

    data_dir = Path(given) if given else default_data_dir()
    if data_dir is None:
        raise ConfigError("--data-dir: no data directory given and DPDA_DATA is not set")
    return data_dir


def _loadmat(path: Path) -> dict:
    from scipy.io import loadmat

    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    return loadmat(str(path))


def _labels(raw: np.ndarray) -> np.ndarray:
    y = np.asarray(raw).astype(np.int64).ravel()
    return y - y.min() if y.min() > 0 else y


def load_domain(data_dir: str | Path, dataset: str, domain: str) -> Domain:
    """Load one domain of ``dataset`` (office-caltech, mnist-usps) by its letter."""
    data_dir = Path(data_dir)
    if dataset == "office-caltech":
        if domain not in OFFICE_FILES:
            raise ValueError(f"unknown office-caltech domain {domain!r} (choose from A C D W)")
        m = _loadmat(data_dir / "office-caltech10-surf" / OFFICE_FILES[domain])
        return Domain(domain, m["fts"].astype(np.float64), _labels(m["labels"]), 10)
    if dataset == "mnist-usps":
        if domain not in DIGIT_KEYS:
            raise ValueError(f"unknown mnist-usps domain {domain!r} (choose from M U)")
        m = _loadmat(data_dir / "mnist-usps" / "mnist_usps_v5.mat")
        xk, yk = DIGIT_KEYS[domain]
        return Domain(domain, m[xk].astype(np.float64), _labels(m[yk]), 10)
    raise ValueError(f"unknown dataset {dataset!r} (choose from {', '.join(DATASETS)})")


def load_table(
    path: str | Path, label_column: str | int | None = -1, id_column: str | None = None
) -> Domain:
    """A labeled table file (see ``dpda.data.tables.read_table`` for the formats)."""
    from dpda.data.tables import read_table

    return read_table(path, label_column, id_column=id_column).domain
