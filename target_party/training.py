"""Local models trained by the target on mapped source rows (and any labeled target rows)."""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.neural_network import MLPClassifier

CLASSIFIERS = ("1nn", "logistic", "mlp")


def make_classifier(kind: str, seed: int = 0):
    if kind == "1nn":
        return KNeighborsClassifier(n_neighbors=1)
    if kind == "logistic":
        return LogisticRegression(max_iter=2000, C=1.0)
    if kind == "mlp":
        return MLPClassifier(hidden_layer_sizes=(128,), max_iter=500, random_state=seed)
    raise ValueError(f"unknown classifier {kind!r} (choose from {', '.join(CLASSIFIERS)})")


def fit_predict(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, kind: str = "1nn", seed: int = 0
) -> tuple[object, np.ndarray]:
    clf = make_classifier(kind, seed)
    clf.fit(x_train, y_train)
    return clf, clf.predict(x_test)


def accuracy(pred: np.ndarray, truth: np.ndarray) -> float:
    """Percent correct."""
    return float(100.0 * np.mean(np.asarray(pred) == np.asarray(truth)))
