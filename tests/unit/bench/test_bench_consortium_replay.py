"""``dpda bench accuracy --protocol consortium-replay``: the job's arms recorded with each
source alone beside them, and the vote replayed on them."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest

from dpda.data.synthetic import two_domains
from dpda.simulation import simulate_consortium
from dpda.target_party.choice import PER_ROW_VOTE
from dpda.target_party.view import AdaptConfig
from dpda.terms import SessionTerms
from tests.bench.consortium_replay import (
    AMONG,
    JOB,
    VARIANTS,
    _recorded,
    replay,
    voters_by_dim,
)

TERMS = SessionTerms(
    dataset="synthetic", epsilon=4.0, delta=1e-4, projection_dim=4, preprocessing="none"
)


@pytest.mark.parametrize("by_dim", [True, False])
def test_the_recording_leaves_the_job_alone_and_the_replay_gives_what_the_job_keeps(
    by_dim: bool,
) -> None:
    from dpda.target_party import choice

    s0, target = two_domains(200, 80, k=6, seed=3)
    s1, _ = two_domains(240, 80, k=6, seed=3)

    def job() -> dict:
        out = simulate_consortium({"s0": s0, "s1": s1}, target, TERMS, "raw", AdaptConfig(), seed=0)
        return out.to_json(TERMS)

    with mock.patch.object(choice, "POOLED_DIM_WEIGHT", by_dim):
        plain = job()
        recorded, rec = _recorded(job)
    # the job's whole choice (every arm, score, guard and the vote) is the same: the recorded
    # one-source arms never reach it
    assert recorded["choice"] == plain["choice"] and recorded["accuracy"] == plain["accuracy"]
    assert plain["choice"]["rule"] == "vote" and 50.0 < plain["accuracy"]["kept"] < 100.0
    heads = {n.split("/")[0] for n in rec["names"]}
    assert {"dpda_pooled_one0a", "dpda_pooled_one0n", "dpda_pooled_one1a"} <= heads
    got = replay(rec)
    assert list(got) == list(VARIANTS)
    assert got[JOB] == pytest.approx(plain["accuracy"]["kept"])
    # the job's rule is one of the replayed weights across ℓ: the same vote, row for row
    same = "× log(1 + ℓ)" if by_dim else "equal weights across ℓ"
    assert got[same] == pytest.approx(got[JOB])


def _row(arm: str, adapt: bool, tv: float, silhouette: float = 0.1) -> dict:
    return {
        "arm": arm, "adapt": adapt, "scaling": "uniform", "dim": 4, "classifier": "1nn",
        "collapsed": False, "scores": {"counts": 1.0 - tv, "silhouette": silhouette},
    }  # fmt: skip


def test_the_replayed_variants_weigh_the_arms_as_they_say() -> None:
    y = np.array([0, 1, 0, 1])
    small = np.array([0, 1, 0, 0])  # the two arms of ℓ 4 (the job's own first): 3 of 4
    wide = y.copy()  # the two of ℓ 50, one not adapted: 4 of 4
    wrong = 1 - y  # source 0 alone, three arms of ℓ 4: none
    names = ["dpda/uniform/4/1nn", "dpda/zscore/4/1nn", "dpda/uniform/50/1nn",
             "dp_no_adaptation/uniform/50/1nn"] + [
        f"dpda_pooled_one0{t}/uniform/4/{c}" for t, c in (("a", "1nn"), ("n", "1nn"), ("a", "x"))
    ]  # fmt: skip
    rows = []
    for n in names:
        mode, dim = n.split("/")[1], int(n.split("/")[2])
        rows.append({**_row(n, not n.startswith("dp_no") and "one0n" not in n, 0.0),
                     "scaling": mode, "dim": dim})  # fmt: skip
    rec = {
        "names": names, "preds": [small, small, wide, wide, wrong, wrong, wrong], "rows": rows,
        "count_share": np.array([0.5, 0.5]), "labels": y, "own": ("uniform", 4, "1nn"),
        "how": PER_ROW_VOTE, "x": np.random.default_rng(0).normal(size=(4, 2)), "seed": 0,
        "pooled": True, "dim_weight": True,
    }  # fmt: skip
    got = replay(rec)
    assert list(got) == list(VARIANTS)
    # the job's rule, × log(1 + ℓ) ÷ log 51: on row 3 the arms of ℓ 4 weigh 1.5·0.41 + 0.41 =
    # 1.02 against the wide ones' 2
    assert got[JOB] == pytest.approx(100.0) and got["× log(1 + ℓ)"] == pytest.approx(100.0)
    # equal weights: 1.5 + 1 against 2, and row 3 goes to the arms of ℓ 4
    assert got["equal weights across ℓ"] == pytest.approx(75.0)
    for label in (
        "× ℓ",
        "× √ℓ",
        "× ℓ²",
        "the largest ℓ's voters alone",
        "the voters of ℓ ≥ 20 alone",
    ):
        assert got[label] == pytest.approx(100.0), label
    # source 0's three arms (3 · 0.41 = 1.23) side with the arms of ℓ 4 on row 3 (2.25 against
    # 2) and lose rows 0–2 to the job's four (3.02)
    assert got[AMONG[0]] == pytest.approx(75.0)
    assert got[AMONG[1]] == pytest.approx(75.0)  # one source alone: at weight 1/1, the same
    # the arm without adaptation at 3 (and ℓ 50): 4 against 1.02 on row 3
    assert got[AMONG[2]] == pytest.approx(100.0)
    # a choice between the two groups' votes keeps one of them: the job's (4 of 4) or source
    # 0's (none)
    assert {got[v] for v in AMONG[3:]} <= {100.0, 0.0}
    assert voters_by_dim(rec) == pytest.approx({"4": 75.0, "50": 100.0})


def test_a_variant_that_leaves_no_voter_says_so_instead_of_labelling_every_row_class_0() -> None:
    y = np.array([1, 1, 0])
    names = ["dpda/uniform/4/1nn", "dpda/zscore/10/1nn"]
    rows = [{**_row(n, True, 0.0), "dim": int(n.split("/")[2])} for n in names]
    rec = {
        "names": names, "preds": [y, y], "rows": rows, "count_share": np.array([0.4, 0.6]),
        "labels": y, "own": ("uniform", 4, "1nn"), "how": PER_ROW_VOTE,
        "x": np.random.default_rng(0).normal(size=(3, 2)), "seed": 0, "pooled": True,
        "dim_weight": True,
    }  # fmt: skip
    got = replay(rec)
    assert got["the voters of ℓ ≥ 20 alone"] is None  # no voter of ℓ ≥ 20
    assert got["the largest ℓ's voters alone"] == pytest.approx(100.0)  # ℓ 10, the largest
    assert got[JOB] == pytest.approx(100.0)
