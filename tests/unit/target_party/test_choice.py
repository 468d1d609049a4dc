"""The target's row classifiers, the label-free criteria, the collapse guard and the choice's
report (``dpda.target_party.choice``)."""

from __future__ import annotations

import numpy as np
import pytest

from dpda.data.preprocessing import Scaling
from dpda.target_party.choice import CRITERIA, _Rescaled, scores_of
from dpda.target_party.training import fit_on_rows


def _clusters(n: int = 300, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 2, size=n)
    x = rng.normal(size=(n, 5)) + 4.0 * y[:, None] * np.eye(5)[0]
    return x, y


@pytest.mark.parametrize("kind", ["target-logistic", "target-knn", "target-spread"])
def test_a_row_classifier_cleans_labels_the_plan_is_unsure_of(kind: str) -> None:
    x, y = _clusters()
    rng = np.random.default_rng(1)
    flipped = rng.random(y.size) < 0.2
    noisy = np.where(flipped, 1 - y, y)
    confidence = np.where(flipped, 0.1, 0.9)  # the plan was unsure where it was wrong
    got = fit_on_rows(x, noisy, confidence, kind)
    assert got is not None
    _, pred = got
    assert np.mean(pred == y) > np.mean(noisy == y) + 0.1


def test_a_row_classifier_refuses_labels_of_one_class() -> None:
    x, _ = _clusters()
    assert fit_on_rows(x, np.zeros(x.shape[0], dtype=int), None, "target-logistic") is None
    with pytest.raises(ValueError, match="target-logistic"):
        fit_on_rows(x, np.arange(x.shape[0]) % 2, None, "svm")


def test_the_rule_keeps_the_best_score_among_arms_near_the_noisy_counts() -> None:
    from dpda.target_party.choice import pick

    def arm(name, score, counts, adapt=True, collapsed=False):
        scores = {"entropy": score, "counts": counts}
        return {"arm": name, "adapt": adapt, "collapsed": collapsed, "scores": scores}

    arms = [arm("a", -0.5, 0.9), arm("b", -0.1, 0.5), arm("c", -0.3, 0.85, adapt=False)]
    assert pick(arms, "entropy", 0.2) == (2, None)  # b scores best but is far from the counts
    assert pick(arms, "entropy", 1.0) == (1, None)  # no gate: the best score
    arms[2]["collapsed"] = True
    at, guard = pick(arms, "entropy", 0.2)
    assert at == 0 and "not kept: c" in guard
    none = [arm("a", float("nan"), 0.9), arm("n", float("nan"), 0.9, adapt=False)]
    at, guard = pick(none, "entropy", 0.2)
    assert at == 1 and "undefined" in guard


def test_labels_that_follow_the_rows_score_above_random_ones() -> None:
    x, y = _clusters()
    shares = np.bincount(y) / y.size
    right = scores_of(x, y, shares, 0)
    wrong = scores_of(x, np.random.default_rng(2).integers(0, 2, size=y.size), shares, 0)
    for c in ("silhouette", "entropy", "consistency"):
        assert right[c] > wrong[c], c
    one = scores_of(x, np.zeros(y.size, dtype=int), shares, 0)
    assert all(np.isnan(one[c]) for c in CRITERIA if c != "counts")
    assert one["counts"] == pytest.approx(shares[0])  # 1 − TV: the shares that agree


def test_a_model_of_another_scaling_reads_the_job_views_rows() -> None:
    from sklearn.linear_model import LogisticRegression

    rng = np.random.default_rng(3)
    rows = rng.normal(size=(200, 4)) * np.array([1.0, 10.0, 0.1, 3.0]) + 5.0
    job, own = Scaling.of(rows, "uniform"), Scaling.of(rows, "zscore")
    y = (rows[:, 1] + 10 * rows[:, 2] > 55).astype(int)
    model = LogisticRegression().fit(own.apply(rows), y)
    wrapped = _Rescaled.wrap(model, job, own)
    assert np.array_equal(wrapped.predict(job.apply(rows)), model.predict(own.apply(rows)))
    assert _Rescaled.wrap(model, job, job) is model


def _terms(**kw):
    from dpda.terms import SessionTerms

    return SessionTerms(**{"dataset": "syn", "epsilon": 8.0, "delta": 1 / 2000, **kw})


def test_the_rehearsal_reports_every_arm_and_keeps_the_best_scored_one(monkeypatch) -> None:
    import dpda.target_party.choice as choice
    from dpda.data.devsuite import pair
    from dpda.simulation import simulate
    from dpda.target_party.choice import CRITERION, STANDARDIZED_VOTE
    from dpda.target_party.view import AdaptConfig

    monkeypatch.setattr(choice, "RULE", "criterion")  # one arm, the best scored
    s, t = pair("iris", 0)
    out = simulate(s, t, _terms(), "raw", AdaptConfig(seed=0), seed=0, scaling_mode="auto")
    data = out.to_json(_terms())
    ch = data["choice"]
    assert ch["rule"] == ch["criterion"] == CRITERION and len(ch["arms"]) >= 6
    gate = ch["count_gate"]
    assert gate == STANDARDIZED_VOTE.gate  # raw rows the source standardizes
    fine = [a for a in ch["arms"] if not a["collapsed"] and a["score"] is not None]
    near = [a for a in fine if 1 - a["scores"]["counts"] <= gate] or fine
    kept = next(a for a in ch["arms"] if a["arm"] == ch["kept"])
    assert kept["score"] == max(a["score"] for a in near)  # the best of those near the counts
    assert 1 - kept["scores"]["counts"] <= gate or near == fine
    assert data["accuracy"]["kept"] == kept["accuracy"] == out.dpda.accuracy
    assert {"dpda", "dp_no_adaptation", "source_only", "source_only_logistic", "otda"} <= set(
        data["accuracy"]
    )
    assert {a["adapt"] for a in ch["arms"]} == {True, False}
    assert {a["scaling"] for a in ch["arms"]} == {"uniform", "zscore"}


def test_the_guard_keeps_the_release_without_adaptation_when_no_arm_is_scored(
    monkeypatch, caplog
) -> None:
    import dpda.target_party.choice as choice
    from dpda.data.devsuite import pair
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig

    def undefined(x, pred, shares, seed, rows=None):
        return dict.fromkeys(CRITERIA, float("nan"))

    monkeypatch.setattr(choice, "scores_of", undefined)
    monkeypatch.setattr(choice, "RULE", "criterion")
    s, t = pair("iris", 0)
    out = simulate(
        s, t, _terms(), "raw", AdaptConfig(seed=0), seed=0, scaling_mode="auto", baselines=False
    )  # the choice alone: no reference is read
    ch = out.to_json(_terms())["choice"]
    assert ch["kept"].startswith("dp_no_adaptation/") and not ch["kept_adapts"]
    assert "undefined" in ch["guard"] and "undefined" in caplog.text
    assert out.dpda.adaptation["kept"] == "dp_no_adaptation"


def test_a_variant_whose_transport_fails_is_left_out_and_said(monkeypatch, caplog) -> None:
    """Another space's transport may fail (a degenerate plan): that variant is no arm, the job
    still keeps one of the others and names what failed."""
    import dpda.target_party.choice as choice
    from dpda.data.devsuite import pair
    from dpda.errors import SolverFailed
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig

    real = choice._variant

    def failing(s, mode, dim):
        if mode == "zscore":
            raise SolverFailed("transport plan is degenerate (mass far from 1)")
        return real(s, mode, dim)

    monkeypatch.setattr(choice, "_variant", failing)
    s, t = pair("iris", 0)
    out = simulate(
        s, t, _terms(), "raw", AdaptConfig(seed=0), seed=0, scaling_mode="auto", baselines=False
    )  # the choice alone: no reference is read
    ch = out.to_json(_terms())["choice"]
    assert ch["failed"] and all(f.startswith("zscore/") for f in ch["failed"])
    assert ch["arms"] and not any(a["arm"].split("/")[1] == "zscore" for a in ch["arms"])
    assert ch["kept"] in {a["arm"] for a in ch["arms"]} or ch["kept"].startswith("vote of")
    assert all(m.split("/")[1] == "uniform" for m in ch["vote"]["members"])
    assert "transport failed" in caplog.text


def test_the_guard_does_not_keep_an_arm_that_names_one_class(monkeypatch) -> None:
    import dpda.target_party.choice as choice
    from dpda.data.devsuite import pair
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig

    real = choice.scores_of

    def one_class_wins(
        x, pred, shares, seed, rows=None
    ):  # the labelling into one class scores best
        got = real(x, pred, shares, seed, rows)
        return {**got, choice.CRITERION: 10.0 if np.unique(pred).size == 1 else 0.0}

    monkeypatch.setattr(choice, "scores_of", one_class_wins)
    monkeypatch.setattr(choice, "RULE", "criterion")  # the guard before the best-scored arm
    s, t = pair("iris", 0)
    real_arms = choice._arms_of

    def with_a_collapsed_arm(*args):
        arms = real_arms(*args)
        bad = arms[0]
        arms.append(
            choice.Arm(bad.adapt, bad.scaling, bad.dim, "1nn", bad.model, np.zeros_like(bad.pred))
        )
        return arms

    monkeypatch.setattr(choice, "_arms_of", with_a_collapsed_arm)
    out = simulate(
        s, t, _terms(), "raw", AdaptConfig(seed=0), seed=0, scaling_mode="auto", baselines=False
    )  # the choice alone: no reference is read
    ch = out.to_json(_terms())["choice"]
    kept = next(a for a in ch["arms"] if a["arm"] == ch["kept"])
    assert not kept["collapsed"] and kept["largest_share"] <= 0.9
    assert "one class" in ch["guard"]
    assert any(a["collapsed"] for a in ch["arms"])


def test_the_rehearsal_writes_the_forecast_the_plan_prints(tmp_path) -> None:
    """``dpda simulate``'s forecast is ``dpda target plan``'s: the same function of the same
    public facts (the session's terms, the release plan both parties compute, the sizes)."""
    from dpda.cli.main import main
    from dpda.data.devsuite import pair, write_csv
    from dpda.planner import plan_batches
    from dpda.target_party.planning import forecast

    s, t = pair("iris", 1)
    write_csv(s, tmp_path / "s.csv")
    write_csv(t, tmp_path / "t.csv")
    out = tmp_path / "out.json"
    files = ["--source-file", str(tmp_path / "s.csv"), "--target-file", str(tmp_path / "t.csv")]
    argv = ["simulate", *files, "--label-column", "label", "--seed", "0", "--json", str(out)]
    assert main(argv) == 0
    import json

    r = json.loads(out.read_text())
    terms = _terms(
        dataset="source",
        delta=r["delta"],
        projection_dim=r["projection_dim"],
        preprocessing=r["preprocessing"]["mode"],
    )
    plan = plan_batches(terms, s.x.shape[0], np.eye(s.x.shape[1], 1))
    expected = forecast(terms, plan, s.x.shape[0], s.n_classes, t.x.shape[0])
    assert r["forecast"]["noise_to_signal"] == pytest.approx(expected.pop("noise_to_signal"))
    assert {k: r["forecast"][k] for k in expected} == expected
    for key in ("dpda", "kept", "dp_no_adaptation", "source_only", "source_only_logistic", "otda"):
        assert isinstance(r["accuracy"][key], float), key
    ch = r["choice"]  # what the job kept: one of its arms, or their vote
    assert ch["kept"] in {a["arm"] for a in ch["arms"]} | {(ch.get("vote") or {}).get("name")}
    assert {"epsilon_spent", "epsilon_budget", "target_epsilon_spent"} <= set(r)


@pytest.mark.parametrize("classifier", ["1nn", "target-logistic"])
def test_the_estimators_saved_model_reads_raw_rows_as_the_job_labels_them(
    classifier: str, tmp_path
) -> None:
    from dpda.data.devsuite import pair
    from dpda.estimator import DPDAClassifier
    from dpda.target_party.training import load_model, save_model

    s, t = pair("iris", 0)
    clf = DPDAClassifier(epsilon=8.0, classifier=classifier, random_state=0).fit(s.x, s.y, t.x)
    assert np.array_equal(clf.predict(t.x), clf.target_predictions_)
    loaded = load_model(save_model(clf.model_, tmp_path / "m.skops"))
    assert np.array_equal(clf.classes_[loaded.predict(t.x)], clf.target_predictions_)


def test_the_development_suite_is_small_offline_and_a_function_of_its_seed() -> None:
    from dpda.data.devsuite import MAX_ROWS, PAIRS, pair
    from dpda.errors import ConfigError

    assert len(PAIRS) >= 6
    for name in PAIRS:
        s, t = pair(name, 0)
        assert s.x.shape[0] <= MAX_ROWS and t.x.shape[0] <= MAX_ROWS, name
        assert s.x.shape[1] == t.x.shape[1] and s.n_classes == t.n_classes >= 2, name
        assert set(np.unique(s.y)) == set(range(s.n_classes)), name
        assert not np.allclose(s.x.mean(axis=0), t.x.mean(axis=0)), name  # shifted
    a, b, c = pair("text", 3), pair("text", 3), pair("text", 4)
    assert np.array_equal(a[1].x, b[1].x) and not np.array_equal(a[1].x, c[1].x)
    assert 0.0 <= a[0].x.min() and a[0].x.max() <= 1.0 and np.mean(a[0].x == 0) > 0.5
    norms = np.linalg.norm(pair("images", 0)[0].x, axis=1)
    assert 10 < np.median(norms) < 18
    with pytest.raises(ConfigError, match="wine"):
        pair("mnist", 0)


def test_the_several_source_families_are_three_shifted_sources_and_a_target() -> None:
    from dpda.data.devsuite import MAX_ROWS, SEVERAL, SEVERAL_REPRESENTATION

    assert set(SEVERAL_REPRESENTATION) == set(SEVERAL)
    for name, make in SEVERAL.items():
        sources, target = make(0)
        assert len(sources) == 3, name
        for src in sources.values():
            assert src.x.shape[1] == target.x.shape[1] and src.n_classes == target.n_classes
            assert src.x.shape[0] <= MAX_ROWS and src.x.min() >= 0.0, name  # per-row bounds
            assert not np.allclose(src.x.mean(axis=0), target.x.mean(axis=0)), name
        a, b = list(sources.values())[:2]
        assert not np.allclose(a.x.mean(axis=0), b.x.mean(axis=0)), name  # each its own shift
        again, other = make(0)[1], make(1)[1]
        assert np.array_equal(again.x, target.x) and not np.array_equal(other.x, target.x)


def test_near_sources_is_a_small_target_that_one_source_nearly_matches() -> None:
    from dpda.data.devsuite import SEVERAL

    sources, target = SEVERAL["near-sources"](0)
    y = target.labels()

    def gap(d) -> float:  # the mean distance between its class means and the target's
        yd = d.labels()
        return float(
            np.mean(
                [
                    np.linalg.norm(d.x[yd == c].mean(axis=0) - target.x[y == c].mean(axis=0))
                    for c in range(target.n_classes)
                ]
            )
        )

    gaps = {name: gap(d) for name, d in sources.items()}
    assert min(gaps, key=gaps.__getitem__) == "s1"
    assert 2 * gaps["s1"] < min(gaps["s2"], gaps["s3"]), gaps
    assert all(target.x.shape[0] < d.x.shape[0] / 2 for d in sources.values())


def test_the_bench_replays_the_jobs_rule_and_scores_it_against_the_oracle() -> None:
    from tests.bench.devsuite import criteria_table

    def arm(name, acc, ent, counts, adapt=True):
        scores = dict.fromkeys(CRITERIA, 0.0) | {"entropy": ent, "counts": counts}
        return {"arm": name, "adapt": adapt, "collapsed": False, "scores": scores, "accuracy": acc}

    run = {"choice": {"arms": [arm("a", 70.0, -0.5, 0.9), arm("b", 90.0, -0.4, 0.85),
                               arm("c", 50.0, -0.1, 0.3, adapt=False)]}}  # fmt: skip
    t = criteria_table([run, run])
    assert t["entropy"]["picks_best"] == "2/2" and t["entropy"]["mean_loss"] == 0.0
    assert t["entropy (no gate)"]["mean_loss"] == 40.0  # c: best entropy, far from the counts
    assert t["always-dpda"]["mean_loss"] == 20.0 and t["always-no-adaptation"]["worst_loss"] == 40
    voted = dict(run, choice=dict(run["choice"], kept_accuracy=92.0))  # a vote beats every arm
    t = criteria_table([voted, dict(voted, choice=dict(voted["choice"], kept_accuracy=80.0))])
    job = t["the job's rule (measured)"]
    assert job["picks_best"] == "1/2" and job["mean_loss"] == 4.0 and job["worst_loss"] == 10.0


def test_the_job_keeps_the_vote_of_the_adapted_arms_near_the_noisy_counts() -> None:
    from dpda.data.devsuite import pair
    from dpda.simulation import simulate
    from dpda.target_party.choice import STANDARDIZED_VOTE, voters
    from dpda.target_party.view import AdaptConfig

    how = STANDARDIZED_VOTE  # raw rows the source standardizes
    s, t = pair("iris", 0)
    terms = _terms(cells=1)  # one point a class: the arms this test names
    out = simulate(s, t, terms, "raw", AdaptConfig(seed=0), seed=0, scaling_mode="auto")
    data = out.to_json(terms)
    ch = data["choice"]
    assert ch["rule"] == "vote" and ch["kept_adapts"] and ch["guard"] is None
    assert data["preprocessing"]["mode"] == "standardize"
    assert ch["count_gate"] == how.gate
    assert ch["vote_rule"]["cut_temperature"] == how.cut_temperature
    members = [ch["arms"][i] for i in voters(ch["arms"], how.gate)]
    assert ch["vote"]["members"][0] == "dpda/uniform/4/1nn"  # the job's own arm breaks ties
    assert sorted(ch["vote"]["members"]) == sorted(a["arm"] for a in members)
    assert all(a["adapt"] and not a["collapsed"] for a in members)
    assert all(1 - a["scores"]["counts"] <= how.gate for a in members)
    by_name = {a["arm"]: a for a in members}
    best = max(a["scores"]["silhouette"] for a in members)
    for name, w in zip(ch["vote"]["members"], ch["vote"]["weights"], strict=True):
        tv = 1.0 - by_name[name]["scores"]["counts"]  # nearer the noisy counts, more weight
        cut = best - by_name[name]["scores"]["silhouette"]  # a cleaner cut, more weight
        assert w == pytest.approx(np.exp(-tv / how.temperature - cut / how.cut_temperature))
    assert max(ch["vote"]["weights"]) <= 1.0 and len(set(ch["vote"]["weights"])) > 1
    assert ch["kept"] == f"vote of {len(members)} adapted arms"
    assert data["accuracy"]["kept"] == ch["vote"]["accuracy"] == out.dpda.accuracy
    assert out.dpda.adaptation["kept"] == "dpda"


def test_a_vote_that_collapses_gives_way_to_the_best_scored_arm(monkeypatch, caplog) -> None:
    import dpda.target_party.choice as choice
    import dpda.target_party.training as training
    from dpda.data.devsuite import pair
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig

    monkeypatch.setattr(training, "vote", lambda preds, q, w=None: np.zeros_like(preds[0]))
    s, t = pair("iris", 0)
    out = simulate(
        s, t, _terms(), "raw", AdaptConfig(seed=0), seed=0, scaling_mode="auto", baselines=False
    )  # the choice alone: no reference is read
    ch = out.to_json(_terms())["choice"]
    assert ch["vote"]["collapsed"] and ch["rule"] == choice.CRITERION
    assert ch["kept"] in {a["arm"] for a in ch["arms"]}
    assert "the vote of" in ch["guard"] and "the vote of" in caplog.text


class Fixed:
    """A fitted model of three classes whose predictions are given."""

    def __init__(self, pred: list[int]) -> None:
        self.pred, self.classes_ = np.array(pred), np.arange(3)

    def predict(self, x):
        return self.pred


def test_arm_vote_counts_one_vote_a_model_and_gives_ties_to_the_first() -> None:
    from dpda.target_party.training import ArmVote, vote

    x = np.zeros((4, 1))
    a, b, c = Fixed([0, 1, 2, 2]), Fixed([1, 1, 0, 2]), Fixed([1, 0, 0, 1])
    m = ArmVote([a, b, c])
    assert m.predict(x).tolist() == [1, 1, 0, 2]  # the majority, each row
    assert ArmVote([a, b]).predict(x).tolist() == [0, 1, 2, 2]  # ties: the first model's
    assert vote([a.pred, b.pred, c.pred], 3).tolist() == m.predict(x).tolist()
    np.testing.assert_allclose(m.predict_proba(x).sum(axis=1), 1.0)
    np.testing.assert_allclose(m.predict_proba(x)[0], [1.5 / 3.5, 2 / 3.5, 0.0])  # weighted
    for two in (m, ArmVote([a, b])):  # the weighted shares' argmax is the vote, ties too
        assert (two.predict_proba(x).argmax(axis=1) == two.predict(x)).all()


def test_a_weighted_vote_lets_a_heavier_voter_outvote_two_lighter_ones() -> None:
    from dpda.target_party.training import ArmVote, vote

    x = np.zeros((3, 1))
    a, b, c = Fixed([0, 0, 0]), Fixed([1, 1, 2]), Fixed([1, 2, 2])
    assert ArmVote([a, b, c]).predict(x).tolist() == [1, 0, 2]  # one vote each: 1.5 < 2
    heavy = ArmVote([a, b, c], [2.0, 1.0, 1.0])  # 3 (2 × 1.5) against 2
    assert heavy.predict(x).tolist() == [0, 0, 0]
    assert vote([a.pred, b.pred, c.pred], 3, [2.0, 1.0, 1.0]).tolist() == [0, 0, 0]
    np.testing.assert_allclose(heavy.predict_proba(x)[0], [3 / 5, 2 / 5, 0.0])
    with pytest.raises(ValueError, match="2 weights for 3 voters"):
        vote([a.pred, b.pred, c.pred], 3, [1.0, 1.0])


def test_a_voters_weight_falls_with_its_count_distance_and_on_standardized_rows_its_cut() -> None:
    from dpda.target_party.choice import (
        PER_ROW_VOTE,
        STANDARDIZED_VOTE,
        vote_rule_of,
        vote_weights,
    )
    from dpda.terms import SessionTerms

    def row(counts: float, silhouette: float | None) -> dict:
        return {"scores": {"counts": counts, "silhouette": silhouette}}

    t_row, t_cut = PER_ROW_VOTE.temperature, STANDARDIZED_VOTE.cut_temperature
    assert PER_ROW_VOTE.cut_temperature is None and t_cut is not None
    assert STANDARDIZED_VOTE.gate > PER_ROW_VOTE.gate  # label shift: see the module docstring
    rows = [row(0.9, 0.30), row(0.9, 0.20), row(1.0, 0.20), row(0.9, None), row(0.9, 0.30)]
    plain = vote_weights(rows, [0, 1, 2, 3])  # per-row representations: the counts alone
    assert plain == pytest.approx(np.exp(-np.array([0.1, 0.1, 0.0, 0.1]) / t_row))
    w = vote_weights(rows, [0, 1, 2, 3], STANDARDIZED_VOTE)  # the best cut among them: 0.30
    t = STANDARDIZED_VOTE.temperature
    assert w[0] == pytest.approx(np.exp(-0.1 / t))
    assert w[1] == pytest.approx(w[0] * np.exp(-0.1 / t_cut))
    assert w[2] == pytest.approx(np.exp(-0.1 / t_cut))  # on the counts
    assert w[3] == pytest.approx(w[0] * np.exp(-1.3 / t_cut))  # undefined: the floor, −1
    assert vote_weights(rows, [1, 2], STANDARDIZED_VOTE) == pytest.approx([np.exp(-0.1 / t), 1.0])
    assert vote_weights(rows, [], STANDARDIZED_VOTE) == []
    raw = SessionTerms(dataset="d", epsilon=8.0, delta=1e-6, preprocessing="standardize")
    assert vote_rule_of(raw) is STANDARDIZED_VOTE
    assert vote_rule_of(raw.model_copy(update={"preprocessing": "none"})) is PER_ROW_VOTE


@pytest.mark.parametrize("seed", range(6))
def test_the_shared_neighbour_order_gives_scikit_learns_cross_validated_knn_score(seed) -> None:
    """``consistency`` reads one neighbour order for every arm; it is the score
    ``cross_val_score`` gives a ``KNeighborsClassifier`` on the same rows and folds."""
    from sklearn.model_selection import cross_val_score
    from sklearn.neighbors import KNeighborsClassifier

    from dpda.target_party.choice import ScoreRows

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(int(rng.integers(40, 300)), 6))
    labels = (
        (x[:, 0] > 0).astype(int) + (x[:, 1] > 0.5) if seed % 2 else rng.integers(0, 4, x.shape[0])
    )
    rows = ScoreRows.of(x, seed)
    ps = np.unique(labels[rows.idx], return_inverse=True)[1]
    k = 10 if seed < 3 else 3
    mine = rows.consistency(ps, 5, k)
    theirs = np.mean(cross_val_score(KNeighborsClassifier(n_neighbors=k), rows.xs, ps, cv=5))
    assert mine == pytest.approx(theirs, abs=1e-12)


@pytest.mark.slow
def test_a_large_target_is_chosen_for_on_a_subsample_and_every_row_is_labeled(monkeypatch):
    """Above ``CHOICE_ROWS`` target rows the arms are fitted and scored on a subsample of that
    many, and the kept model labels every row, a block at a time."""
    import dpda.target_party.choice as choice
    from dpda.data.devsuite import pair
    from dpda.simulation import simulate
    from dpda.target_party.view import AdaptConfig

    monkeypatch.setattr(choice, "CHOICE_ROWS", 60)
    monkeypatch.setattr(choice, "LABEL_BLOCK", 16)
    s, t = pair("iris", 0)
    out = simulate(s, t, _terms(), "raw", AdaptConfig(seed=0), seed=0, scaling_mode="auto")
    data = out.to_json(_terms())
    assert data["choice"]["scored_rows"] == 60 < t.x.shape[0]
    pred = np.asarray(out.dpda.predictions)  # the kept model's, on every row
    assert pred.shape == (t.x.shape[0],)
    assert data["accuracy"]["kept"] == pytest.approx(100.0 * np.mean(pred == t.labels()))


def test_on_the_examples_label_shift_the_correct_labellings_still_vote() -> None:
    """The shipped example's target holds its classes in other shares than the source (a label
    shift of about 0.2 in total variation), so a labelling that gets every row right sits about
    0.2 from the source's noisy counts. On this draw of the noise such arms fall just outside
    the per-row gate; on the standardized rows the example's job runs on, they vote, and the
    job keeps nearly every row right."""
    from dpda.cli.demo import DEMO_DELTA
    from dpda.data.synthetic import two_domains
    from dpda.simulation import simulate
    from dpda.target_party.choice import PER_ROW_VOTE, voters
    from dpda.target_party.view import AdaptConfig
    from dpda.terms import SessionTerms

    src, tgt = two_domains()
    shares = [np.bincount(d.y, minlength=5) / d.y.size for d in (src, tgt)]
    assert 0.5 * np.abs(shares[0] - shares[1]).sum() > 0.15  # the example's label shift
    terms = SessionTerms(dataset="synthetic", epsilon=8.0, delta=DEMO_DELTA)
    out = simulate(src, tgt, terms, "raw", AdaptConfig(seed=21), seed=1014, baselines=False)
    data = out.to_json(terms)
    ch, arms = data["choice"], data["choice"]["arms"]
    assert data["cells"] == 3 and data["preprocessing"]["mode"] == "standardize"
    right = {a["arm"] for a in arms if a["adapt"] and a["accuracy"] >= 98.0}
    outside = {a["arm"] for a in arms if 1 - a["scores"]["counts"] > PER_ROW_VOTE.gate}
    assert right & outside  # correct labellings the per-row gate would leave out ...
    assert not right & outside & {arms[i]["arm"] for i in voters(arms, PER_ROW_VOTE.gate)}
    assert right & outside & set(ch["vote"]["members"])  # ... vote under the job's gate
    assert data["accuracy"]["kept"] >= 97.0
