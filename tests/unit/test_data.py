"""Loaders and the 1-NN baselines of DESIGN.md §8 (JDA paper, to two decimals)."""

from __future__ import annotations

import numpy as np
import pytest

from dpda.data.loaders import load_domain, load_table
from dpda.data.preprocessing import l2_normalize, row_normalize, zscore_own
from dpda.data.synthetic import two_domains
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
    with pytest.raises(ValueError, match="labels"):
        load_table(tmp_path / "bad.npy")
