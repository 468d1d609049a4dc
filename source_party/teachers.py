"""PATE teachers on the source: disjoint parts, one scikit-learn model each, vote counts.

The partition is a uniformly random split of the rows (data-independent), so each record sits in
exactly one part and can move at most one teacher's vote — the sensitivity ``common.dp.pate``
accounts for. Vote counts never leave this module's caller except through
``common.dp.pate.noisy_argmax``.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression


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
        n_teachers: int,
        n_classes: int,
        rng: np.random.Generator,
    ) -> None:
        if not (1 <= n_teachers <= x.shape[0]):
            raise ValueError("the number of teachers must lie between 1 and the number of rows")
        self.n_classes = n_classes
        self.dim = x.shape[1]
        parts = np.array_split(rng.permutation(x.shape[0]), n_teachers)
        self.teachers: list[object] = []
        for part in parts:
            labels = y[part]
            if np.unique(labels).size == 1:
                self.teachers.append(_Constant(int(labels[0])))
                continue
            clf = LogisticRegression(max_iter=500, C=1.0)
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
