"""PATE teachers on the source: disjoint parts, one scikit-learn model each, vote counts.

The partition is given: each record's teacher comes from a keyed hash of its stable record id
(``teacher_assignment``), so it does not depend on the data or on the number of rows, each
record sits in exactly one part, and adding, removing or replacing one record changes at most one
teacher's vote: the sensitivity ``dpda.dp.pate`` accounts for. A teacher whose part is empty
always votes for class 0 (a data-independent vote). Vote counts never leave this module's caller
except through ``dpda.dp.pate.noisy_argmax``.
"""

from __future__ import annotations

import hashlib
import hmac
import warnings

import numpy as np
from sklearn.exceptions import ConvergenceWarning
from sklearn.linear_model import LogisticRegression


def teacher_assignment(n_rows: int, n_teachers: int, key: bytes) -> np.ndarray:
    """Teacher of each record: a keyed hash (HMAC-SHA256) of its stable record id (its index
    in the source's dataset) modulo T. Adding, removing or replacing one record moves exactly
    that record's teacher, never a boundary between parts (``array_split`` of a permutation
    shifted the boundaries when n changed, moving two teachers)."""
    out = np.empty(n_rows, dtype=np.int64)
    for i in range(n_rows):
        h = hmac.new(key, i.to_bytes(8, "little"), hashlib.sha256).digest()
        out[i] = int.from_bytes(h[:8], "little") % n_teachers
    return out


class _Constant:
    """A teacher whose part holds a single class."""

    def __init__(self, label: int) -> None:
        self.label = label

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.full(x.shape[0], self.label, dtype=np.int64)


class TeacherEnsemble:
    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        parts: np.ndarray,
        n_teachers: int,
        n_classes: int,
    ) -> None:
        if not (1 <= n_teachers <= x.shape[0]):
            raise ValueError("the number of teachers must lie between 1 and the number of rows")
        if (
            parts.shape != (x.shape[0],)
            or parts.min(initial=0) < 0
            or parts.max(initial=0) >= n_teachers
        ):
            raise ValueError("every record needs a teacher in [0, n_teachers)")
        self.n_classes = n_classes
        self.dim = x.shape[1]
        self.teachers: list[object] = []
        for t in range(n_teachers):
            part = np.flatnonzero(parts == t)
            labels = y[part]
            if part.size == 0 or np.unique(labels).size == 1:
                self.teachers.append(_Constant(int(labels[0]) if part.size else 0))
                continue
            clf = LogisticRegression(max_iter=500, C=1.0)
            with warnings.catch_warnings():  # an unconverged teacher still votes; its vote is
                warnings.simplefilter("ignore", ConvergenceWarning)  # what the noise protects
                clf.fit(x[part], labels)
            self.teachers.append(clf)

    def votes(self, queries: np.ndarray) -> np.ndarray:
        """``(n, q)`` vote counts of the teachers on ``queries (n, d)``."""
        counts = np.zeros((queries.shape[0], self.n_classes), dtype=np.int64)
        rows = np.arange(queries.shape[0])
        for t in self.teachers:
            pred = np.asarray(t.predict(queries), dtype=np.int64)  # type: ignore[attr-defined]
            np.add.at(counts, (rows, pred), 1)
        return counts
