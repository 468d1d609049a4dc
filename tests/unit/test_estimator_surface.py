"""The estimators' surface: class probabilities, and the skada estimator as ``DPDAClassifier``
(every parameter, one declaration) with a score in a skada pipeline."""

from __future__ import annotations

import importlib.util
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


def test_the_estimators_defaults_are_the_declared_ones() -> None:
    """Every parameter the estimators share with the session terms, the target's [job] table or
    AdaptConfig defaults to that declaration's value (read from it here, never restated), so one
    changed default changes every surface."""
    import dataclasses

    from dpda.estimator import JOB_PARAMS
    from dpda.service.config import TargetJob
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import DEFAULT_EPSILON, SessionTerms, term_default

    adapt = {f.name: f.default for f in dataclasses.fields(AdaptConfig)}
    job = TargetJob.model_fields
    estimators = [dpda.DPDAClassifier]
    if importlib.util.find_spec("skada") is not None:
        estimators.append(dpda.DPDASkadaEstimator)
    for cls in estimators:
        checked = set()
        for name, param in inspect.signature(cls).parameters.items():
            if name == "epsilon":  # the terms require ε: the rehearsal's own default
                expected = DEFAULT_EPSILON
            elif name == "delta":  # 1/(10·n) of the source's rows, computed in fit
                expected = None
            elif name in JOB_PARAMS:  # the [job] table's own (pate_queries: when PATE is on)
                expected = job[name].default
            elif name in SessionTerms.model_fields:
                expected = term_default(name)
            elif name in adapt:
                expected = adapt[name]
            elif name in job:
                expected = job[name].default
            else:
                continue
            assert param.default == expected, f"{cls.__name__}.{name}"
            checked.add(name)
        shared = (set(SessionTerms.model_fields) | set(adapt) | set(job)) & set(
            inspect.signature(cls).parameters
        )
        assert checked == shared and len(checked) >= 11, sorted(shared - checked)
