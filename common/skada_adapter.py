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
    class's, so a new parameter reaches both); ``estimator_`` is the fit.

    Parameters
    ----------
    epsilon, delta, privacy_unit, neighbouring
        The session's budget and privacy unit, as ``DPDAClassifier``'s.
    projection, projection_dim, batch_size, steps, max_steps
        The release's space and minibatches, as ``DPDAClassifier``'s.
    noise_multiplier, histogram_noise_ratio, histogram_share, calibration, clip_norm
        The release's noise, as ``DPDAClassifier``'s.
    release, cells, synthetic_points, synthetic_rows_per_point
        What the source releases, as ``DPDAClassifier``'s.
    sinkhorn_steps, sinkhorn_reg, sinkhorn_debias, sinkhorn_learning_rate
        The ``sinkhorn-synthetic`` release's knobs, as ``DPDAClassifier``'s.
    cost, metric_share, metric_dim, metric_pairs, metric_margin
        The ground cost and its learned metric, as ``DPDAClassifier``'s.
    metric_clip, metric_steps, metric_learning_rate
        The learned metric's gradient steps, as ``DPDAClassifier``'s.
    pate_teachers, pate_aggregator, pate_space, pate_queries, pate_share, method
        The release channels and PATE, as ``DPDAClassifier``'s.
    representation, scaling
        The per-row transform and the column scaling, as ``DPDAClassifier``'s.
    reg_e, reg_g, classifier, select, transport_step, refine, keep
        The target's adaptation and the model it keeps, as ``DPDAClassifier``'s.
    target_epsilon, target_row_clip, target_row_queries, target_query_epsilon
        The target's own DP disclosures, as ``DPDAClassifier``'s.
    attribute_bound, random_state
        The attribute unit's bound and the seed, as ``DPDAClassifier``'s.

    Attributes
    ----------
    estimator_ : DPDAClassifier
        The ``DPDAClassifier`` fitted on the source's rows (``sample_domain`` positive) and
        the target's (negative).
    classes_ : numpy.ndarray
        ``estimator_.classes_``.
    """

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
