"""The estimators' surface: class probabilities, and the skada estimator as ``DPDAClassifier``
(every parameter, one declaration) with a score in a skada pipeline."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import dpda
from dpda.data.synthetic import two_domains

NAMES = np.array(["cat", "dog", "eel", "fox", "gnu"])


@pytest.mark.slow  # a whole in-process job
def test_predict_proba_matches_predict() -> None:
    s, t = two_domains(200, 80, k=8)
    clf = dpda.DPDAClassifier(random_state=0, projection_dim=4).fit(s.x, NAMES[s.labels()], t.x)
    proba = clf.predict_proba(t.x)
    assert proba.shape == (80, 5) and np.allclose(proba.sum(axis=1), 1.0)
    assert (clf.classes_[proba.argmax(axis=1)] == clf.predict(t.x)).all()


@pytest.mark.slow  # a whole in-process job
def test_the_skada_estimator_takes_every_parameter_and_scores() -> None:
    skada = pytest.importorskip("skada")
    from sklearn.preprocessing import StandardScaler

    params = inspect.signature(dpda.DPDAClassifier).parameters
    assert inspect.signature(dpda.DPDASkadaEstimator).parameters == params
    est = dpda.DPDASkadaEstimator(scaling="uniform", random_state=0, projection_dim=4)
    assert est.get_params() == {**dpda.DPDAClassifier().get_params(), "scaling": "uniform",
                                "random_state": 0, "projection_dim": 4}  # fmt: skip
    s, t = two_domains(200, 80, k=8)
    X = np.vstack([s.x, t.x])
    y = np.concatenate([s.labels(), np.full(80, -1)])
    domain = np.concatenate([np.ones(200, int), -np.ones(80, int)])
    pipe = skada.make_da_pipeline(StandardScaler(), est).fit(X, y, sample_domain=domain)
    target = -np.ones(80, int)
    score = pipe.score(t.x, t.labels(), sample_domain=target)
    assert score == pytest.approx(np.mean(pipe.predict(t.x, sample_domain=target) == t.labels()))
    assert pipe.predict_proba(t.x, sample_domain=target).shape == (80, 5)
