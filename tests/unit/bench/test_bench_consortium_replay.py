"""``dpda bench accuracy --protocol consortium-replay``: the job's arms recorded with each
source alone beside them, and the vote replayed on them."""

from __future__ import annotations

import numpy as np
import pytest

from dpda.data.synthetic import two_domains
from dpda.simulation import simulate_consortium
from dpda.target_party.choice import PER_ROW_VOTE
from dpda.target_party.view import AdaptConfig
from dpda.terms import SessionTerms
from tests.bench.consortium_replay import AMONG, BY_DIM, VARIANTS, _recorded, replay, voters_by_dim

TERMS = SessionTerms(
    dataset="synthetic", epsilon=4.0, delta=1e-4, projection_dim=4, preprocessing="none"
)


def test_the_recording_adds_each_source_alone_without_changing_what_the_job_keeps() -> None:
    domains = {f"s{k}": two_domains(120, 80, k=6, seed=k)[0] for k in range(2)}
    _, target = two_domains(120, 80, k=6, seed=9)

    def job() -> dict:
        out = simulate_consortium(domains, target, TERMS, "raw", AdaptConfig(), seed=0)
        return out.to_json(TERMS)

    plain = job()
    recorded, rec = _recorded(job)
    heads = {n.split("/")[0] for n in rec["names"]}
    assert {"dpda_pooled_one0a", "dpda_pooled_one0n", "dpda_pooled_one1a"} <= heads
    # the job's vote never counts the recorded one-source arms: it keeps what it keeps
    assert recorded["choice"]["rule"] == "vote"
    assert recorded["accuracy"]["kept"] == plain["accuracy"]["kept"]
    got = replay(rec)
    assert list(got) == list(VARIANTS)
    assert got[VARIANTS[0]] == pytest.approx(plain["accuracy"]["kept"])


def _row(arm: str, adapt: bool, tv: float, silhouette: float = 0.1) -> dict:
    return {
        "arm": arm, "adapt": adapt, "scaling": "uniform", "dim": 4, "classifier": "1nn",
        "collapsed": False, "scores": {"counts": 1.0 - tv, "silhouette": silhouette},
    }  # fmt: skip


def test_the_replayed_variants_weigh_the_arms_as_they_say() -> None:
    y = np.array([0, 0, 1, 1, 0, 1])
    job = np.array([0, 0, 1, 1, 1, 0])  # the job's own adapted arm (ℓ 4): 4 of 6
    plain = np.array([0, 0, 1, 1, 0, 1])  # the pooled release, not adapted (ℓ 4): 6 of 6
    wrong = 1 - y  # source 0 alone: every row wrong
    wide = np.array([0, 0, 1, 1, 0, 0])  # an adapted arm in a space of ℓ 50: 5 of 6
    names = ["dpda/uniform/4/1nn", "dp_no_adaptation/uniform/4/1nn", "dpda/uniform/50/1nn"] + [
        f"dpda_pooled_one0{t}/uniform/4/{c}" for t, c in (("a", "1nn"), ("n", "1nn"), ("a", "x"))
    ]
    rows = [_row(n, not n.startswith("dp_no") and not n.endswith("n/uniform/4/1nn"), 0.0)
            for n in names]  # fmt: skip
    rows[2]["dim"] = 50
    rec = {
        "names": names, "preds": [job, plain, wide, wrong, wrong, wrong], "rows": rows,
        "count_share": np.array([0.5, 0.5]), "labels": y, "own": ("uniform", 4, "1nn"),
        "how": PER_ROW_VOTE, "x": np.random.default_rng(0).normal(size=(6, 2)), "seed": 0,
    }  # fmt: skip
    got = replay(rec)
    assert list(got) == list(VARIANTS)
    by_dim = list(BY_DIM)
    # the job's rule: weights 1.5·log 5, log 5 and log 51 (÷ log 51): row 4 to the two arms
    # that say 0 (0.41 + 1 against 0.61), row 5 to the job's arm and the wide one (0.61 + 1)
    assert got[by_dim[0]] == pytest.approx(100 * 5 / 6)
    # equal weights across ℓ: the job's arm (1.5) against two of 1 on rows 4 and 5 — row 4 to
    # the two that say 0, row 5 to the job's and the wide one's 0: 5 of 6
    assert got[by_dim[1]] == pytest.approx(100 * 5 / 6)
    # the largest ℓ's voters alone: the wide arm
    assert got["the largest ℓ's voters alone"] == pytest.approx(100 * 5 / 6)
    # source 0's three arms (ℓ 4: 3 · 0.41) lose rows 0–3 to the job's three (2.02) and win
    # rows 4 and 5 with the arms that are wrong there (1.84 against 1.41, 2.84 against 0.41)
    assert got[AMONG[0]] == pytest.approx(100 * 4 / 6)
    # at weight 1/1 (one source alone) the same
    assert got[AMONG[1]] == pytest.approx(got[AMONG[0]])
    # the arm without adaptation at 3: 3·0.41 = 1.23 against the job's 0.61 on row 4; on row 5
    # against 0.61 + 1: every row but row 5
    assert got[AMONG[2]] == pytest.approx(100 * 5 / 6)
    # a choice between the two groups' votes keeps one of them
    assert {got[v] for v in AMONG[3:]} <= {got[by_dim[0]], 0.0}
    # the voters' accuracy by ℓ: the job's two arms of ℓ 4, the wide one
    assert voters_by_dim(rec) == pytest.approx({"4": 100 * 10 / 12, "50": 100 * 5 / 6})
