"""Trained PATE teachers are shared by the sessions that would train the same ones: a second
session with the same feature map and teacher count does not retrain, concurrent sessions wait
for one training, and the cache is bounded by entries and by bytes."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling
from dpda.dp.ledger import Budget
from dpda.protocol import TargetDisclosure
from dpda.source_party.releases import SourceReleaser
from dpda.source_party.teachers import TeacherCache, TeacherEnsemble, teacher_assignment
from dpda.terms import SessionTerms
from tests.support import memory_releaser

HANG = 30  # bounds a hang only


def _releaser() -> SourceReleaser:
    rng = np.random.default_rng(1)
    x = rng.normal(size=(200, 12))
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    rel, _ = memory_releaser(Domain("d", x, y, 3), "d", Budget(40, 1e-5), rng)
    return rel


def _open(rel: SourceReleaser, basis: np.ndarray, teachers: int = 5, jl: bool = False) -> str:
    terms = SessionTerms(
        dataset="d",
        epsilon=4,
        delta=1e-5,
        projection="jl" if jl else "target-pca",
        projection_dim=basis.shape[1],
        dpda=False,
        pate_epsilon=4,
        pate_queries=10,
        pate_teachers=teachers,
    )
    scaling = Scaling(np.zeros(12), np.ones(12))
    disclosure = TargetDisclosure(scaling, None if jl else basis)
    return rel.open_session(terms, disclosure).session_id


def _basis(seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(12, 4)))
    return np.ascontiguousarray(q)


def test_a_second_session_with_the_same_terms_does_not_retrain() -> None:
    rel = _releaser()
    first, second = _open(rel, _basis(0)), _open(rel, _basis(0))
    a = rel.pate.prepare_teachers(first)
    b = rel.pate.prepare_teachers(second)
    assert a is b and rel.pate.teacher_cache().trainings == 1
    q = np.random.default_rng(5).normal(size=(6, 4))
    assert rel.query_teachers(second, 0, q).shape == (6,)
    assert rel.pate.teacher_cache().trainings == 1  # answering reuses them too
    # another basis, another teacher count or a fresh JL matrix: other teachers
    rel.pate.prepare_teachers(_open(rel, _basis(1)))
    rel.pate.prepare_teachers(_open(rel, _basis(0), teachers=6))
    rel.pate.prepare_teachers(_open(rel, _basis(0), jl=True))
    assert rel.pate.teacher_cache().trainings == 4


def test_closing_a_session_keeps_the_teachers_for_the_next() -> None:
    rel = _releaser()
    sid = _open(rel, _basis(0))
    rel.pate.prepare_teachers(sid)
    rel.close_session(sid)
    rel.pate.prepare_teachers(_open(rel, _basis(0)))
    assert rel.pate.teacher_cache().trainings == 1


def _ensemble(n_teachers: int = 3) -> TeacherEnsemble:
    rng = np.random.default_rng(n_teachers)
    x = rng.normal(size=(60, 4))
    y = (x[:, 0] > 0).astype(np.int64)
    return TeacherEnsemble(x, y, teacher_assignment(60, n_teachers, b"k" * 32), n_teachers, 2)


def test_the_cache_is_bounded_by_entries() -> None:
    cache = TeacherCache(max_entries=2, max_bytes=1 << 30)
    ens = {k: _ensemble() for k in "abc"}
    cache.get("a", lambda: ens["a"])
    cache.get("b", lambda: ens["b"])
    cache.get("a", lambda: ens["a"])  # a is now the most recently used
    cache.get("c", lambda: ens["c"])  # b goes
    assert len(cache) == 2 and cache.trainings == 3
    assert cache.get("a", _ensemble) is ens["a"] and cache.trainings == 3
    cache.get("b", _ensemble)
    assert cache.trainings == 4 and len(cache) == 2


def test_the_cache_is_bounded_by_bytes() -> None:
    one = _ensemble().nbytes
    cache = TeacherCache(max_entries=100, max_bytes=2 * one)
    for key in range(5):
        cache.get(key, _ensemble)
        assert cache.nbytes <= 2 * one
    assert len(cache) == 2
    small = TeacherCache(max_entries=100, max_bytes=one - 1)
    got = small.get("x", _ensemble)  # larger than the bound: returned, not kept
    assert isinstance(got, TeacherEnsemble) and len(small) == 0 and small.nbytes == 0


def test_the_cache_refuses_negative_bounds() -> None:
    with pytest.raises(ValueError, match="bounds"):
        TeacherCache(max_entries=-1)


def test_concurrent_requests_for_the_same_teachers_train_once() -> None:
    cache = TeacherCache()
    entered, go = threading.Event(), threading.Event()
    built = _ensemble()

    def slow() -> TeacherEnsemble:
        entered.set()
        go.wait(HANG)
        return built

    got: list[TeacherEnsemble] = []
    first = threading.Thread(target=lambda: got.append(cache.get("k", slow)))
    first.start()
    assert entered.wait(HANG)
    second = threading.Thread(target=lambda: got.append(cache.get("k", _ensemble)))
    second.start()
    other = cache.get("other", _ensemble)  # another key does not wait for it
    assert not go.is_set() and isinstance(other, TeacherEnsemble)
    go.set()
    first.join(HANG)
    second.join(HANG)
    assert got == [built, built] and cache.trainings == 2  # "k" once, "other" once


def test_a_failed_training_is_retried_by_the_next_caller() -> None:
    cache = TeacherCache()

    def fails() -> TeacherEnsemble:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        cache.get("k", fails)
    assert len(cache) == 0 and cache.trainings == 0
    assert isinstance(cache.get("k", _ensemble), TeacherEnsemble) and cache.trainings == 1


def test_a_second_peers_first_answer_retrains_so_it_learns_nothing_of_the_first() -> None:
    """Peer A's teachers (its scaling and basis) are A's alone: B's first answer with the very
    same terms trains B's own (as it would with any other basis), so its timing tells B
    nothing about whether A opened such a session; each peer still shares among its own."""
    rel = _releaser()
    a1, a2, b1 = _open(rel, _basis(0)), _open(rel, _basis(0)), _open(rel, _basis(0))
    q = np.random.default_rng(5).normal(size=(6, 4))
    rel.pate.prepare_teachers(a1, "peer-a")
    rel.pate.prepare_teachers(a2, "peer-a")
    assert rel.pate.teacher_cache("peer-a").trainings == 1
    assert rel.pate.teacher_cache("peer-b").trainings == 0
    ens_b = rel.pate.prepare_teachers(b1, "peer-b")  # B's first: trained for B
    assert rel.pate.teacher_cache("peer-b").trainings == 1
    assert ens_b is not rel.pate.prepare_teachers(a1)  # A's session stays bound to A's cache
    assert rel.pate.answer(b1, 0, q, peer="peer-b").labels.shape == (6,)
    assert rel.pate.teacher_cache("peer-b").trainings == 1
    # the same teachers either way: sharing or not changes no vote
    np.testing.assert_array_equal(rel.pate.votes(b1, q), rel.pate.votes(a1, q))
    assert rel.pate.teacher_cache("peer-a").trainings == 1


def test_many_open_sessions_hold_no_more_teachers_than_the_peers_bound() -> None:
    """Sessions do not pin their teachers: with many sessions of distinct bases open, what is
    held is the peer's cache alone, within its entries and bytes."""
    from dpda.source_party.pate_answers import PEER_TEACHER_BYTES, PEER_TEACHER_ENTRIES

    rel = _releaser()
    sessions = [_open(rel, _basis(seed)) for seed in range(PEER_TEACHER_ENTRIES + 3)]
    for sid in sessions:
        rel.pate.prepare_teachers(sid, "peer-a")
    cache = rel.pate.teacher_cache("peer-a")
    assert len(cache) == PEER_TEACHER_ENTRIES and cache.nbytes <= PEER_TEACHER_BYTES
    assert cache.trainings == len(sessions)
    rel.pate.votes(sessions[0], np.zeros((2, 4)))  # evicted: trained again, for the same peer
    assert cache.trainings == len(sessions) + 1
