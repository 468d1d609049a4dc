"""``dpda.DPDAClassifier``: scikit-learn's estimator checks, grid search, and a skada pipeline.

Every check scikit-learn runs on a classifier applies, and passes (none is marked expected to
fail)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.model_selection import GridSearchCV
from sklearn.utils.estimator_checks import parametrize_with_checks

import dpda
from dpda.data.synthetic import two_domains

pytestmark = pytest.mark.slow  # every test here fits the estimator (scikit-learn runs dozens)


@parametrize_with_checks([dpda.DPDAClassifier(random_state=0)])
def test_scikit_learn_estimator_checks(estimator, check) -> None:
    check(estimator)


def test_fit_on_source_and_target_predicts_target_labels() -> None:
    s, t = two_domains(400, 300)
    names = np.array(["cat", "dog", "eel", "fox", "gnu"])
    clf = dpda.DPDAClassifier(epsilon=8.0, random_state=0).fit(s.x, names[s.labels()], t.x)
    assert np.mean(clf.predict(t.x) == names[t.labels()]) > 0.9
    assert 0 < clf.epsilon_spent_ <= 8.0
    assert clf.ledger_ and clf.ledger_[-1]["spend_after"] == pytest.approx(clf.epsilon_spent_)
    assert set(clf.mapped_labels_) <= set(names) and clf.mapped_.shape[1] == t.x.shape[1]
    params = clone(clf).get_params()
    assert params["epsilon"] == 8.0 and params["random_state"] == 0


def test_grid_search_over_the_transport_strengths() -> None:
    s, _ = two_domains(300, 10)
    # select="none": each fit keeps the grid's reg_g (circular selection would choose its own)
    est = dpda.DPDAClassifier(random_state=0, select="none")
    grid = GridSearchCV(est, {"reg_g": [0.1, 1.0]}, cv=2)
    grid.fit(s.x, s.labels())
    assert grid.best_params_["reg_g"] in (0.1, 1.0)
    assert np.all(np.isfinite(grid.cv_results_["mean_test_score"]))  # both values were fitted
    best = grid.best_estimator_
    assert best.reg_g == grid.best_params_["reg_g"] and best.select == "none"
    assert best.predict(s.x).shape == (s.x.shape[0],)


def test_inside_a_skada_pipeline() -> None:
    skada = pytest.importorskip("skada")
    from sklearn.preprocessing import StandardScaler

    s, t = two_domains(300, 200)
    X = np.vstack([s.x, t.x])
    y = np.concatenate([s.labels(), np.full(t.x.shape[0], -1)])  # skada masks target labels
    domain = np.concatenate([np.ones(s.x.shape[0], int), -np.ones(t.x.shape[0], int)])
    pipe = skada.make_da_pipeline(StandardScaler(), dpda.DPDASkadaEstimator(random_state=0))
    pipe.fit(X, y, sample_domain=domain)
    pred = pipe.predict(t.x, sample_domain=-np.ones(t.x.shape[0], int))
    assert np.mean(pred == t.labels()) > 0.9
