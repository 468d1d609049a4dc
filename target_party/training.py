"""Local models trained by the target on mapped source rows (and any labeled target rows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.base import BaseEstimator, ClassifierMixin
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer

from dpda.data.preprocessing import Scaling, per_row
from dpda.dp.preprocessing_dp import Standardization

# trained on the adapted class points (or mapped source rows)
POINT_CLASSIFIERS = ("1nn", "logistic", "mlp")
# trained on the target's own rows, labeled by what the transport (or the release without
# adaptation) gives each of them: post-processing of the release and the target's rows
ROW_CLASSIFIERS = ("target-logistic", "target-knn", "target-spread")
CLASSIFIERS = POINT_CLASSIFIERS + ROW_CLASSIFIERS
ROW_NEIGHBOURS = 10  # target-knn and target-spread: neighbours among the target's rows
CONFIDENT_SHARE = 0.5  # target-spread: the share of rows whose label it keeps (most certain)


class ArmVote(ClassifierMixin, BaseEstimator):
    """The weighted majority vote of fitted models of the same rows (the label-free choice's
    arms): each model's predicted class gets that model's weight (``weights``; one each when
    None), the first model's multiplied by ``FIRST_WEIGHT``: a tie goes to it, and with
    unequal weights it is also a preference (at weight 1 it outvotes one voter of weight 1,
    and two of weight under 0.75), which is the rule the job's tables were measured with.
    ``predict_proba``: each class's share of the weighted votes (its argmax is ``predict``).
    Fitted already: it is built from fitted models, never ``fit``.

    Parameters
    ----------
    models : list of fitted classifiers
        The voters; the first one breaks ties.
    weights : list of float, optional
        Each voter's weight, positive; None gives every voter one vote.
    """

    FIRST_WEIGHT = 1.5

    def __init__(self, models: list | None = None, weights: list[float] | None = None) -> None:
        self.models = models
        self.weights = weights

    def fit(self, x: np.ndarray, y: np.ndarray | None = None) -> ArmVote:
        """The vote is made of fitted models: fitting it leaves it as it is."""
        return self

    def __sklearn_is_fitted__(self) -> bool:
        return bool(self.models)

    @property
    def classes_(self) -> np.ndarray:
        return np.unique(np.concatenate([np.asarray(m.classes_) for m in self.models or []]))

    def _votes(self, x: np.ndarray) -> np.ndarray:
        classes = self.classes_
        at = [np.searchsorted(classes, np.asarray(m.predict(x))) for m in self.models or []]
        # a vote saved before voters had weights loads without the attribute: one each
        return tally(at, classes.size, getattr(self, "weights", None))

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self.classes_[self._votes(x).argmax(axis=1)]

    def predict_proba(self, x: np.ndarray) -> np.ndarray:
        votes = self._votes(x)
        return votes / np.maximum(votes.sum(axis=1, keepdims=True), 1e-300)


def tally(
    preds: list[np.ndarray], n_classes: int, weights: list[float] | None = None
) -> np.ndarray:
    """``ArmVote``'s weighted votes (rows × n_classes) of predictions already made (class
    indices in [0, n_classes)): each model's weight (one when ``weights`` is None), the
    first one's times ``FIRST_WEIGHT``."""
    votes = np.zeros((np.asarray(preds[0]).size, n_classes))
    rows = np.arange(votes.shape[0])
    w = [1.0] * len(preds) if weights is None else [float(v) for v in weights]
    if len(w) != len(preds):
        raise ValueError(f"{len(w)} weights for {len(preds)} voters")
    for i, (p, wi) in enumerate(zip(preds, w, strict=True)):
        votes[rows, np.asarray(p, dtype=np.int64)] += wi * (ArmVote.FIRST_WEIGHT if i == 0 else 1.0)
    return votes


def vote(preds: list[np.ndarray], n_classes: int, weights: list[float] | None = None) -> np.ndarray:
    """``ArmVote``'s rule on predictions already made (class indices in [0, n_classes))."""
    return tally(preds, n_classes, weights).argmax(axis=1)


def make_classifier(kind: str, seed: int = 0):
    """A classifier of ``POINT_CLASSIFIERS``; a row classifier stands on 1-NN (its rows'
    labels come from it, ``fit_on_rows``)."""
    if kind in ROW_CLASSIFIERS:
        kind = "1nn"
    if kind == "1nn":
        return KNeighborsClassifier(n_neighbors=1)
    if kind == "logistic":
        return LogisticRegression(max_iter=2000, C=1.0)
    if kind == "mlp":
        return MLPClassifier(hidden_layer_sizes=(128,), max_iter=500, random_state=seed)
    raise ValueError(f"unknown classifier {kind!r} (choose from {', '.join(CLASSIFIERS)})")


def fit_on_rows(
    x: np.ndarray,
    labels: np.ndarray,
    confidence: np.ndarray | None,
    kind: str,
    seed: int = 0,
) -> tuple[object, np.ndarray] | None:
    """A classifier trained on the target's own rows ``x`` with the soft labels a plan gives
    them: ``labels`` (each row's class) and ``confidence`` (the share of the row's received
    mass that class holds, in [0, 1]; None: every row alike). ``target-logistic``: logistic
    regression, each row weighted by its confidence; ``target-knn``: a vote of each row's
    ``ROW_NEIGHBOURS`` nearest rows; ``target-spread``: label spreading over the rows' kNN
    graph from the ``CONFIDENT_SHARE`` most confident rows. None when the labels name fewer
    than two classes (nothing to learn from them)."""
    labels = np.asarray(labels, dtype=np.int64)
    if np.unique(labels).size < 2:
        return None
    w = np.ones(labels.size) if confidence is None else np.clip(confidence, 0.05, 1.0)
    if kind == "target-logistic":
        clf: object = LogisticRegression(max_iter=1000, C=1.0)
        clf.fit(x, labels, sample_weight=w * (w.size / w.sum()))  # type: ignore[attr-defined]
    elif kind == "target-knn":
        clf = KNeighborsClassifier(n_neighbors=min(ROW_NEIGHBOURS, labels.size))
        clf.fit(x, labels)  # type: ignore[attr-defined]
    elif kind == "target-spread":
        from sklearn.semi_supervised import LabelSpreading

        seeds = np.full(labels.size, -1, dtype=np.int64)
        keep = np.argsort(-w, kind="stable")[: max(1, int(CONFIDENT_SHARE * labels.size))]
        seeds[keep] = labels[keep]
        if np.unique(seeds[keep]).size < 2:
            return None
        import warnings

        clf = LabelSpreading(kernel="knn", n_neighbors=min(ROW_NEIGHBOURS, labels.size - 1))
        with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # rows no seed reaches: class 0
            clf.fit(x, seeds)  # type: ignore[attr-defined]
    else:
        raise ValueError(f"unknown classifier {kind!r} (choose from {', '.join(ROW_CLASSIFIERS)})")
    with np.errstate(invalid="ignore", divide="ignore"):
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return clf, np.asarray(clf.predict(x))  # type: ignore[attr-defined]


def fit_predict(
    x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray, kind: str = "1nn", seed: int = 0
) -> tuple[object, np.ndarray]:
    clf = make_classifier(kind, seed)
    clf.fit(x_train, y_train)
    return clf, clf.predict(x_test)


def accuracy(pred: np.ndarray, truth: np.ndarray) -> float:
    """Percent correct."""
    return float(100.0 * np.mean(np.asarray(pred) == np.asarray(truth)))


# ------------------------------------------------------------------------- the saved model
def scale_columns(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """The target's column scaling, ``(x − mean) / std``, as a pipeline step; rows of another
    width than the model's are refused, saying both widths."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != mean.shape[0]:
        got = f"{x.shape[1]} columns" if x.ndim == 2 else f"shape {x.shape}"
        raise ValueError(
            f"the model takes rows of {mean.shape[0]} features (the columns it was fitted on, in "
            f"that order); these rows have {got}"
        )
    return (x - mean) / std


def model_pipeline(
    representation: str,
    scaling: Scaling,
    classifier: object,
    clip_norm: float | None = None,
    standardization: Standardization | None = None,
) -> Pipeline:
    """The job's model as one pipeline on *raw* rows: the per-row transform, the target's own
    standardization (preprocessing = standardize: rows into the unit ball), the rows clipped
    to ``clip_norm`` (a source-space session's C), the target's scaling, then the fitted
    classifier — ``model.predict(raw_rows)`` is the job's prediction."""
    from dpda.dp.mechanisms import clip_rows
    from dpda.dp.preprocessing_dp import standardize_rows

    rows = FunctionTransformer(per_row, kw_args={"representation": representation})
    cols = FunctionTransformer(scale_columns, kw_args={"mean": scaling.mean, "std": scaling.std})
    one = np.zeros((1, scaling.mean.shape[0]))
    steps: list[tuple[str, object]] = [("per_row", rows.fit(one))]
    if standardization is not None:
        st = standardization
        std = FunctionTransformer(
            standardize_rows,
            kw_args={"loc": st.loc, "scale": st.scale, "clip_norm": st.clip_norm},
        )
        steps.append(("standardize", std.fit(one)))
    if clip_norm is not None:
        clip = FunctionTransformer(clip_rows, kw_args={"clip_norm": clip_norm})
        steps.append(("clip", clip.fit(one)))
    return Pipeline([*steps, ("scaling", cols.fit(one)), ("classifier", classifier)])


# what a saved model may contain beyond skops' defaults: dpda's own two functions
_TRUSTED_PREFIXES = (
    "dpda.data.preprocessing.per_row",
    "dpda.target_party.training.scale_columns",
    "dpda.dp.mechanisms.clip_rows",
    "dpda.dp.preprocessing_dp.standardize_rows",
    "dpda.target_party.training.ArmVote",
)


def save_model(model: Pipeline, path: str | Path) -> Path:
    """skops format: loading it runs no code from the file."""
    import skops.io as sio

    path = Path(path)
    sio.dump(model, path)
    return path


def load_model(path: str | Path) -> Pipeline:
    """Load a model ``save_model`` wrote, trusting only scikit-learn's types and dpda's own
    functions and vote (``_TRUSTED_PREFIXES``); anything else in the file is refused (skops
    would otherwise run it).

    Parameters
    ----------
    path : str or pathlib.Path
        The model file, in skops format (a job's saved model, ``save_model``).

    Returns
    -------
    sklearn.pipeline.Pipeline
        The job's model on raw rows: ``model.predict(raw_rows)`` gives its predictions.

    Raises
    ------
    ConfigError
        The file holds a type other than scikit-learn's and the few of dpda's it trusts.
    """
    import skops.io as sio

    from dpda.errors import ConfigError

    untrusted = sio.get_untrusted_types(file=path)
    unknown = [t for t in untrusted if not (t.startswith("sklearn.") or t in _TRUSTED_PREFIXES)]
    if unknown:
        raise ConfigError(f"{path}: the model file holds types dpda does not trust: {unknown}")
    return sio.load(path, trusted=untrusted)
