"""``dpda.DPDASkadaEstimator``: ``DPDAClassifier`` as a skada domain-adaptation estimator.

skada passes source and target rows together, told apart by ``sample_domain`` (positive:
source, negative: target) with the target's labels masked; this class splits them and fits a
``DPDAClassifier`` — so ``make_da_pipeline(StandardScaler(), DPDASkadaEstimator())`` works.
Needs skada (``pip install 'dpda[skada]'``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from skada.base import DAEstimator
from skada.utils import check_X_y_domain, extract_source_indices

from dpda.estimator import DPDAClassifier


class DPDASkadaEstimator(DAEstimator):
    """The parameters are ``DPDAClassifier``'s (stored verbatim); ``estimator_`` is the fit."""

    def __init__(
        self,
        epsilon: float = 8.0,
        privacy_unit: str = "record",
        projection_dim: int = 50,
        reg_e: float = 0.02,
        reg_g: float = 0.5,
        classifier: str = "1nn",
        random_state: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.privacy_unit = privacy_unit
        self.projection_dim = projection_dim
        self.reg_e = reg_e
        self.reg_g = reg_g
        self.classifier = classifier
        self.random_state = random_state

    def fit(
        self, X: Any, y: Any = None, sample_domain: Any = None, *, sample_weight: Any = None
    ) -> DPDASkadaEstimator:
        X, y, sample_domain = check_X_y_domain(X, y, sample_domain)
        is_source = extract_source_indices(sample_domain)
        self.estimator_ = DPDAClassifier(**self.get_params()).fit(
            X[is_source], y[is_source], X[~is_source] if np.any(~is_source) else None
        )
        self.classes_ = self.estimator_.classes_
        return self

    def predict(self, X: Any, sample_domain: Any = None, *, sample_weight: Any = None) -> Any:
        return self.estimator_.predict(X)


__all__ = ["DPDASkadaEstimator"]
