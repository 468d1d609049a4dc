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
    y: np.ndarray  # (n,) labels in [0, q)
    n_classes: int


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


def load_table(path: str | Path, label_column: int = -1) -> Domain:
    """A ``.npy`` (2-D, labels in ``label_column``) or ``.csv`` file (numbers only, no header)."""
    path = Path(path)
    if path.suffix == ".npy":
        arr = np.load(path, allow_pickle=False)
    elif path.suffix == ".csv":
        arr = np.loadtxt(path, delimiter=",", ndmin=2)
    else:
        raise ValueError("table files must be .npy or .csv")
    if arr.ndim != 2 or arr.shape[1] < 2:
        raise ValueError("table must be 2-D with at least one feature and a label column")
    y = arr[:, label_column]
    if not np.all(np.isfinite(arr)) or not np.allclose(y, np.round(y)) or y.min() < 0:
        raise ValueError("labels must be non-negative integers and all values finite")
    x = np.delete(arr, label_column % arr.shape[1], axis=1).astype(np.float64)
    yi = y.astype(np.int64)
    return Domain(path.stem, x, yi, int(yi.max()) + 1)
