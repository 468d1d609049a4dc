"""Local models trained by the target on mapped source rows (and any labeled target rows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.neural_network import MLPClassifier
from sklearn.pipeline import Pipeline
from sklearn.preprocessing import FunctionTransformer

from dpda.data.preprocessing import Scaling, per_row
from dpda.dp.preprocessing_dp import Standardization

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
)


def save_model(model: Pipeline, path: str | Path) -> Path:
    """skops format: loading it runs no code from the file."""
    import skops.io as sio

    path = Path(path)
    sio.dump(model, path)
    return path


def load_model(path: str | Path) -> Pipeline:
    """Load a model ``save_model`` wrote, trusting only scikit-learn's types and dpda's two
    functions; anything else in the file is refused (skops would otherwise run it)."""
    import skops.io as sio

    from dpda.errors import ConfigError

    untrusted = sio.get_untrusted_types(file=path)
    unknown = [t for t in untrusted if not (t.startswith("sklearn.") or t in _TRUSTED_PREFIXES)]
    if unknown:
        raise ConfigError(f"{path}: the model file holds types dpda does not trust: {unknown}")
    return sio.load(path, trusted=untrusted)
