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
    """The parameters are ``DPDAClassifier``'s, declared once there (its ``__init__`` is this
    class's, so a new parameter reaches both); ``estimator_`` is the fit."""

    __init__ = DPDAClassifier.__init__

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

    def predict_proba(self, X: Any, sample_domain: Any = None, *, sample_weight: Any = None) -> Any:
        return self.estimator_.predict_proba(X)

    def score(
        self, X: Any, y: Any, sample_domain: Any = None, *, sample_weight: Any = None
    ) -> float:
        """Accuracy (a fraction) of the predictions on ``X`` against ``y``."""
        from sklearn.metrics import accuracy_score

        return float(accuracy_score(y, self.predict(X), sample_weight=sample_weight))


__all__ = ["DPDASkadaEstimator"]
