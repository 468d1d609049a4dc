"""PATE: DESIGN.md §8 numbers, the noise drawn against the ledger's claim, disjoint teachers."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpda.cli.main import main
from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling
from dpda.dp.events import event_to_json
from dpda.dp.ledger import Budget, PrivacyLedger
from dpda.dp.pate import (
    answers_event,
    calibrate_pate,
    noise_std,
    noisy_counts,
    pate_epsilon,
)
from dpda.errors import BudgetExceeded, InvalidInput, PolicyRefused
from dpda.protocol import TargetDisclosure
from dpda.source_party.releases import SourceReleaser
from dpda.source_party.teachers import TeacherEnsemble, teacher_assignment
from dpda.terms import SessionTerms
from tests.support import memory_releaser
from tests.unit.noise_checks import std_matches


@pytest.mark.parametrize(
    "agg,scale,queries,delta,bound,expected",
    [
        ("lnmax", 0.05, 100, 1e-5, "moments", 5.303),
        ("lnmax", 0.05, 1000, 1e-6, "moments", 21.908),
        ("gnmax", 40.0, 1000, 1e-6, "rdp", 5.927),
    ],
)
def test_design_table(agg, scale, queries, delta, bound, expected) -> None:
    assert pate_epsilon(agg, scale, queries, delta, bound) == pytest.approx(expected, abs=5e-4)


def test_pld_is_no_looser_than_the_moments_bound() -> None:
    assert pate_epsilon("lnmax", 0.05, 100, 1e-5, "pld") <= 5.303


def test_planner_cli(capsys) -> None:
    assert (
        main(
            [
                "privacy",
                "pate",
                "--aggregator",
                "lnmax",
                "--gamma",
                "0.05",
                "--queries",
                "1000",
                "--delta",
                "1e-6",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["epsilon"] == pytest.approx(21.908, abs=5e-4)
    assert (
        main(
            [
                "privacy",
                "pate",
                "--aggregator",
                "gnmax",
                "--sigma",
                "40",
                "--queries",
                "1000",
                "--delta",
                "1e-6",
                "--json",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["epsilon"] == pytest.approx(5.927, abs=5e-4)


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(agg=st.sampled_from(["lnmax", "gnmax"]), q=st.integers(1, 300), eps=st.floats(0.3, 10))
def test_calibration_never_overshoots(agg: str, q: int, eps: float) -> None:
    scale = calibrate_pate(agg, q, eps, 1e-5)
    assert pate_epsilon(agg, scale, q, 1e-5, "pld") <= eps + 1e-9


@pytest.mark.parametrize("agg,scale", [("lnmax", 0.2), ("gnmax", 7.0)])
def test_aggregator_noise_has_the_claimed_scale(agg: str, scale: float) -> None:
    votes = np.zeros((4000, 5))
    noise = noisy_counts(votes, agg, scale, np.random.default_rng(0)) - votes
    assert std_matches(noise, noise_std(agg, scale))
    assert not std_matches(noise, noise_std(agg, scale) * 0.7)
    assert not std_matches(noise, noise_std(agg, scale) * 1.3)


def test_teachers_partition_is_disjoint_and_complete() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(101, 3))
    y = (x[:, 0] > 0).astype(np.int64)
    parts = teacher_assignment(101, 7, b"k" * 32)
    assert parts.shape == (101,) and set(parts.tolist()) <= set(range(7))  # one part each
    ens = TeacherEnsemble(x, y, parts, 7, 2)
    v = ens.votes(x[:10])
    assert v.shape == (10, 2) and np.all(v.sum(axis=1) == 7)  # one vote per teacher


def test_one_added_record_moves_exactly_one_teacher() -> None:
    """Item 8: with array_split(permutation(n), T) adding a record shifted part boundaries and
    moved two (or more) teachers while the charge assumed one. A keyed hash of the stable record
    id moves only the added record's teacher."""
    key = b"\x01" * 32
    before = teacher_assignment(500, 10, key)
    after = teacher_assignment(501, 10, key)
    assert np.array_equal(after[:500], before)  # nobody else moves
    changed = {int(after[500])}
    assert len(changed) == 1
    # the old partition rule, for contrast: one added record moves more than one part
    perm_n = np.array_split(np.random.default_rng(3).permutation(500), 10)
    perm_n1 = np.array_split(np.random.default_rng(3).permutation(501), 10)
    old = {i: t for t, p in enumerate(perm_n) for i in p.tolist()}
    new = {i: t for t, p in enumerate(perm_n1) for i in p.tolist() if i < 500}
    assert sum(old[i] != new[i] for i in range(500)) > 1


def _releaser(pate_queries: int = 30) -> tuple[SourceReleaser, str, PrivacyLedger]:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 12))
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    rel, ledger = memory_releaser(Domain("d", x, y, 3), "d", Budget(10, 1e-5), rng)
    terms = SessionTerms(
        dataset="d",
        epsilon=4,
        delta=1e-5,
        projection="jl",
        projection_dim=6,
        dpda=False,
        pate_epsilon=4,
        pate_queries=pate_queries,
        pate_teachers=10,
    )
    info = rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(12), np.ones(12))))
    return rel, info.session_id, ledger


@pytest.mark.slow
def test_answers_are_charged_with_the_planned_event() -> None:
    rel, sid, ledger = _releaser()
    _, info = rel.session(sid)
    q = np.random.default_rng(2).normal(size=(20, 6))
    labels = rel.query_teachers(sid, 0, q)
    assert labels.shape == (20,) and labels.dtype == np.int64
    entry = ledger.store.entries("d")[-1]
    assert entry.privacy_unit == "record" and entry.params["n_queries"] == 20
    assert entry.dp_event == event_to_json(answers_event("gnmax", info.plan.pate_scale, 20))
    assert entry.params["scale"] == info.plan.pate_scale
    assert ledger.spent("d") <= 4.0


@pytest.mark.slow
def test_queries_beyond_the_terms_or_malformed_are_refused() -> None:
    rel, sid, ledger = _releaser(pate_queries=25)
    rel.query_teachers(sid, 0, np.zeros((20, 6)))
    n = len(ledger.store.entries())
    with pytest.raises(BudgetExceeded):
        rel.query_teachers(sid, 1, np.zeros((10, 6)))
    for bad in (np.zeros((3, 5)), np.full((2, 6), np.nan), np.zeros((0, 6))):
        with pytest.raises(InvalidInput):
            rel.query_teachers(sid, 2, bad)
    # the largest finite double, and a value just past the limit: a clear refusal, where the
    # teachers' scores would overflow
    for big in (np.finfo(np.float64).max, -1e13):
        with pytest.raises(InvalidInput, match="beyond"):
            rel.query_teachers(sid, 2, np.full((2, 6), big))
    assert len(ledger.store.entries()) == n


@pytest.mark.slow
def test_raw_queries_need_the_source_to_opt_in() -> None:
    rel, _, _ = _releaser()
    terms = SessionTerms(
        dataset="d",
        epsilon=4,
        delta=1e-5,
        projection="jl",
        projection_dim=6,
        dpda=False,
        pate_epsilon=4,
        pate_queries=5,
        pate_space="raw",
    )
    with pytest.raises(PolicyRefused, match="raw"):
        rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(12), np.ones(12))))
    rel.allow_raw_queries = True
    info = rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(12), np.ones(12))))
    assert rel.query_teachers(info.session_id, 0, np.zeros((2, 12))).shape == (2,)
