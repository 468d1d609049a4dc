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

import inspect
import json
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from dpda.data.loaders import Domain
from dpda.data.preprocessing import check_representation, default_attribute_bound
from dpda.data.tables import Table
from dpda.dp.ledger import check_delta, default_delta
from dpda.policy import TargetPrivacyPolicy
from dpda.service.config import TERMS_OF_JOB, TargetJob, terms_of
from dpda.simulation import simulate
from dpda.target_party.training import model_pipeline
from dpda.target_party.view import ADAPT_KNOBS, adapt_default, resolve_scaling
from dpda.terms import DEFAULT_EPSILON, term_default

# how the job's rows are prepared and which channels it runs: the [job] fields that are neither
# session terms nor adaptation knobs
JOB_PARAMS = ("representation", "scaling", "method", "pate_queries", "pate_share")


def _job_default(name: str) -> Any:
    return TargetJob.model_fields[name].default


def _params() -> dict[str, Any]:
    """Every parameter and its default, read from the declarations: the session terms a job
    sets (``TERMS_OF_JOB``; ``SessionTerms``' defaults), the [job] table's own fields
    (``JOB_PARAMS``, ``TargetJob``), the adaptation knobs (``ADAPT_KNOBS``, ``AdaptConfig``),
    the target's own DP disclosures (``dpda simulate``'s ``--target-*``; ``TargetPrivacyPolicy``)
    and the rehearsal's own (the attribute bound of its policy, the seed)."""
    out: dict[str, Any] = {"epsilon": DEFAULT_EPSILON, "delta": None}
    for name in TERMS_OF_JOB:
        if name not in out and name != "dataset":
            out[name] = term_default(name)
    out.update({name: _job_default(name) for name in JOB_PARAMS})
    out.update({name: adapt_default(name) for name in ADAPT_KNOBS})
    own = TargetPrivacyPolicy.model_fields
    out.update(
        target_epsilon=None,  # None: the target's statistics are used exact (in process)
        target_row_clip=None,
        target_row_queries=None,  # synthetic with target_epsilon, else exact
        target_query_epsilon=own["query_epsilon"].default,
        attribute_bound=None,
        random_state=None,
    )
    return out


PARAMS = _params()


def _column_names(X: Any) -> list[str] | None:
    """The feature names of a table or a frame; None for an array (or a headerless table)."""
    if isinstance(X, Table):
        return list(X.columns) if X.named else None
    cols = getattr(X, "columns", None)
    if cols is None or isinstance(X, np.ndarray):
        return None
    return [str(c) for c in cols]


def _in_order(X: Any, names: list[str] | None, what: str) -> Any:
    """``X`` with its columns in the order of ``names`` (the source's at ``fit``), matched by
    name; a name that differs is refused naming the columns. Arrays pass as they are."""
    given = _column_names(X)
    if isinstance(X, Table):
        X_array: Any = X.x
    else:
        X_array = X
    if names is None or given is None:
        return X_array
    if given == names:
        return X_array
    missing = [c for c in names if c not in given]
    extra = [c for c in given if c not in names]
    if missing or extra or len(set(given)) != len(given):
        parts = [f"lacks {', '.join(map(repr, missing))}"] if missing else []
        parts += [f"has {', '.join(map(repr, extra))}, which fit's X has not"] if extra else []
        raise ValueError(
            f"The feature names should match those that were passed during fit: {what} "
            + ("; ".join(parts) or "repeats a column name")
        )
    if isinstance(X, Table):
        return X.x[:, [given.index(c) for c in names]]
    return X[names]  # a frame, reordered: the names still travel with it


class DPDAClassifier(ClassifierMixin, BaseEstimator):
    """Differentially private domain adaptation from a labeled source to an unlabeled target.

    ``fit(X, y, Xt=None)``: ``X, y`` the source's rows and labels (any label values), ``Xt``
    the target's unlabeled rows (default ``X`` itself: scikit-learn's own checks call
    ``fit(X, y)``). ``predict(X)`` applies the fitted pipeline (per-row transform, the target's
    scaling, the classifier trained on the mapped source rows) to raw rows. Frames and
    ``dpda.read_table`` tables are matched by column name: ``Xt`` and every later ``X`` are put
    in the order of ``fit``'s ``X``, and refused, naming the columns, when the names differ.

    The parameters are the job's, each by the name and with the default its declaration gives
    (``PARAMS``: the session terms, the [job] table, the adaptation knobs, the target's own DP
    disclosures as ``dpda simulate``'s ``--target-*`` flags), plus ``attribute_bound`` and
    ``random_state`` (``dpda simulate --seed``): the same files, ε and seed give ``dpda
    simulate``'s predictions.

    Fitted attributes: ``classes_``, ``n_features_in_``, ``epsilon_spent_`` (this fit's charge
    on the source's ledger), ``target_epsilon_spent_`` (the target's own, with
    ``target_epsilon``), ``ledger_`` (its entries, as JSON dicts), ``mapped_`` and
    ``mapped_labels_`` (the source's noisy rows mapped into the target's space, and their
    labels), ``sigma_`` (σ/w), ``model_`` (the pipeline) and ``target_predictions_``.
    """

    def __init__(self, **params: Any) -> None:
        unknown = sorted(set(params) - set(PARAMS))
        if unknown:
            raise TypeError(f"DPDAClassifier: unknown parameter(s) {', '.join(unknown)}")
        for name, default in PARAMS.items():
            setattr(self, name, params.get(name, default))

    # scikit-learn reads the parameters off the signature: one keyword per declared parameter
    __init__.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
        + [
            inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
            for name, default in PARAMS.items()
        ]
    )

    def __getattr__(self, name: str) -> Any:  # typed access to the declared parameters
        raise AttributeError(name)

    def fit(self, X: Any, y: Any, Xt: Any = None) -> DPDAClassifier:
        names = _column_names(X)
        X = _in_order(X, names, "X")
        if Xt is not None:
            Xt = _in_order(Xt, names, "Xt")
        X, y = validate_data(self, X, y, dtype=np.float64, ensure_min_samples=2)
        self.columns_ = names
        check_classification_targets(y)
        self.classes_, y_enc = np.unique(y, return_inverse=True)
        xt = X if Xt is None else validate_data(self, Xt, dtype=np.float64, reset=False)
        rep = self.representation
        check_representation(X, rep, "representation")
        check_representation(xt, rep, "representation")
        n = X.shape[0]
        delta = self.delta if self.delta is not None else default_delta(n)
        check_delta(delta, n, "delta", "the source (X)")
        terms = terms_of(_Settings(self, dataset="source", delta=delta))
        seed = self.random_state
        from dpda.target_party.view import adapt_config

        cfg = adapt_config(self, seed if seed is not None else 0)
        source = Domain("source", X, y_enc.astype(np.int64), len(self.classes_))
        target = Domain("target", xt, None, 0)
        bound = self.attribute_bound
        if bound is None:
            bound = default_attribute_bound(rep, X.shape[1])
        scaling = resolve_scaling(self.scaling, terms)
        out = simulate(
            source,
            target,
            terms,
            rep,
            cfg,
            seed,
            baselines=False,
            scaling_mode=scaling,
            methods=(self.method,),
            pate_queries=self.pate_queries,
            pate_share=self.pate_share,
            attribute_bound=bound
            if bound is not None
            else default_attribute_bound(rep, X.shape[1]),
            target_epsilon=self.target_epsilon,
            target_row_clip=self.target_row_clip,
            target_row_queries=self.target_row_queries
            or ("synthetic" if self.target_epsilon is not None else "exact"),
            target_query_epsilon=self.target_query_epsilon,
            keep_views=True,
        )
        res = out.dpda
        self.epsilon_spent_ = res.epsilon_spent
        self.target_epsilon_spent_ = out.to_json(terms)["target_epsilon_spent"]
        self.sigma_ = res.noise_multiplier
        self.ledger_ = [json.loads(e.to_json()) for e in out.ledgers[self.method]]
        self.mapped_ = res.mapped
        self.mapped_labels_ = self.classes_[res.mapped_labels]
        self.target_predictions_ = self.classes_[res.predictions]
        # the space the model was fitted in: the job's view, or the one it adopted from the
        # source's DP standardization
        fitted = res.view if res.view is not None else out.views[self.method]
        self.model_ = model_pipeline(
            rep, fitted.scaling, res.model, fitted.clip_norm, fitted.standardization
        )
        return self

    def _rows(self, X: Any) -> np.ndarray:
        check_is_fitted(self, "model_")
        X = _in_order(X, self.columns_, "X")
        return validate_data(self, X, dtype=np.float64, reset=False)

    def predict(self, X: Any) -> np.ndarray:
        rows = self._rows(X)  # not fitted: NotFittedError first
        return self.classes_[self.model_.predict(rows)]

    def predict_proba(self, X: Any) -> np.ndarray:
        """(n, len(classes_)): the classifier's class probabilities (0 or 1 for ``1nn``); a
        class no mapped source row carried has probability 0."""
        X = self._rows(X)
        proba = np.asarray(self.model_.predict_proba(X))
        out = np.zeros((X.shape[0], len(self.classes_)))
        out[:, np.asarray(self.model_.classes_, dtype=np.int64)] = proba
        return out

    def score(self, X: Any, y: Any, sample_weight: Any = None) -> float:
        """Accuracy (a fraction) on ``X`` (matched by column name, as ``predict``) against ``y``."""
        from sklearn.metrics import accuracy_score

        return float(accuracy_score(y, self.predict(X), sample_weight=sample_weight))


class _Settings:
    """The estimator's parameters read by name (``terms_of``), with ``changes``."""

    def __init__(self, est: DPDAClassifier, **changes: Any) -> None:
        self._est, self._changes = est, changes

    def __getattr__(self, name: str) -> Any:
        if name in self._changes:
            return self._changes[name]
        return getattr(self._est, name)


__all__ = ["DPDAClassifier"]
