"""``dpda.DPDAClassifier``: both parties in one process, as a scikit-learn estimator.

For rehearsal and research: ``fit(Xs, ys, Xt)`` runs the same job code as ``dpda target run``
against an in-process source that holds ``(Xs, ys)`` behind an in-memory ledger under the
rehearsal policy (the unit and release asked for, every other rule of the default policy). The
real deployment keeps the source's rows on the source's machine; this estimator does not, so it
protects nothing by itself — it tells what a job would charge and how well it would do.

Parameters are stored verbatim (``clone``, ``get_params`` and grid search work); every
derived value is computed in ``fit``. Their defaults are the session terms' (``term_default``)
and the target job's (``TargetJob``, ``adapt_default``), read from those declarations.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from dpda.data.loaders import Domain
from dpda.data.preprocessing import check_representation, default_attribute_bound
from dpda.dp.ledger import check_delta, default_delta
from dpda.service.config import TargetJob
from dpda.simulation import simulate
from dpda.target_party.training import model_pipeline
from dpda.target_party.view import adapt_config, adapt_default, resolve_scaling
from dpda.terms import DEFAULT_EPSILON, SessionTerms, term_default


class DPDAClassifier(ClassifierMixin, BaseEstimator):
    """Differentially private domain adaptation from a labeled source to an unlabeled target.

    ``fit(X, y, Xt=None)``: ``X, y`` the source's rows and labels (any label values), ``Xt``
    the target's unlabeled rows (default ``X`` itself: scikit-learn's own checks call
    ``fit(X, y)``). ``predict(X)`` applies the fitted pipeline (per-row transform, the target's
    scaling, the classifier trained on the mapped source rows) to raw rows.

    Fitted attributes: ``classes_``, ``n_features_in_``, ``epsilon_spent_`` (this fit's charge
    on the source's ledger), ``ledger_`` (its entries, as JSON dicts), ``mapped_`` and
    ``mapped_labels_`` (the source's noisy rows mapped into the target's space, and their
    labels), ``sigma_`` (σ/w), ``model_`` (the pipeline) and ``target_predictions_``.
    """

    def __init__(
        self,
        epsilon: float = DEFAULT_EPSILON,
        delta: float | None = None,
        privacy_unit: str = term_default("privacy_unit"),
        projection_dim: int | None = term_default("projection_dim"),
        release: str | None = term_default("release"),
        batch_size: int = term_default("batch_size"),
        representation: str = TargetJob.model_fields["representation"].default,
        scaling: str = TargetJob.model_fields["scaling"].default,
        reg_e: float = adapt_default("reg_e"),
        reg_g: float = adapt_default("reg_g"),
        classifier: str = adapt_default("classifier"),
        select: str = adapt_default("select"),
        attribute_bound: float | None = None,
        random_state: int | None = None,
    ) -> None:
        self.epsilon = epsilon
        self.delta = delta
        self.privacy_unit = privacy_unit
        self.projection_dim = projection_dim
        self.release = release
        self.batch_size = batch_size
        self.representation = representation
        self.scaling = scaling
        self.reg_e = reg_e
        self.reg_g = reg_g
        self.classifier = classifier
        self.select = select
        self.attribute_bound = attribute_bound
        self.random_state = random_state

    def fit(self, X: Any, y: Any, Xt: Any = None) -> DPDAClassifier:
        X, y = validate_data(self, X, y, dtype=np.float64, ensure_min_samples=2)
        check_classification_targets(y)
        self.classes_, y_enc = np.unique(y, return_inverse=True)
        xt = X if Xt is None else validate_data(self, Xt, dtype=np.float64, reset=False)
        check_representation(X, self.representation, "representation")
        check_representation(xt, self.representation, "representation")
        n = X.shape[0]
        delta = self.delta if self.delta is not None else default_delta(n)
        check_delta(delta, n, "delta", "the source (X)")
        terms = SessionTerms.model_validate(
            {
                "dataset": "source",
                "epsilon": self.epsilon,
                "delta": delta,
                "privacy_unit": self.privacy_unit,
                "projection_dim": self.projection_dim,
                "release": self.release,
                "batch_size": self.batch_size,
            }
        )
        cfg = adapt_config(self, self.random_state if self.random_state is not None else 0)
        source = Domain("source", X, y_enc.astype(np.int64), len(self.classes_))
        target = Domain("target", xt, None, 0)
        bound = self.attribute_bound
        out = simulate(
            source,
            target,
            terms,
            self.representation,
            cfg,
            self.random_state,
            baselines=False,
            scaling_mode=self.scaling,
            attribute_bound=bound
            if bound is not None
            else default_attribute_bound(self.representation, X.shape[1]),
        )
        res = out.dpda
        self.epsilon_spent_ = res.epsilon_spent
        self.sigma_ = res.noise_multiplier
        self.ledger_ = [json.loads(e.to_json()) for e in out.ledgers["dpda"]]
        self.mapped_ = res.mapped
        self.mapped_labels_ = self.classes_[res.mapped_labels]
        self.target_predictions_ = self.classes_[res.predictions]
        from dpda.target_party.view import target_view

        view = target_view(
            target, self.representation, scaling_mode=resolve_scaling(self.scaling, terms),
            terms=terms,
        )  # fmt: skip
        fitted = res.view if res.view is not None else view  # the space the model was fitted in
        self.model_ = model_pipeline(
            self.representation,
            fitted.scaling,
            res.model,
            fitted.clip_norm,
            fitted.standardization,
        )
        return self

    def predict(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "model_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        return self.classes_[self.model_.predict(X)]

    def predict_proba(self, X: Any) -> np.ndarray:
        """(n, len(classes_)): the classifier's class probabilities (0 or 1 for ``1nn``); a
        class no mapped source row carried has probability 0."""
        check_is_fitted(self, "model_")
        X = validate_data(self, X, dtype=np.float64, reset=False)
        proba = np.asarray(self.model_.predict_proba(X))
        out = np.zeros((X.shape[0], len(self.classes_)))
        out[:, np.asarray(self.model_.classes_, dtype=np.int64)] = proba
        return out


__all__ = ["DPDAClassifier"]
