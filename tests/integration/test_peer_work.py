"""Work a peer sizes (its number of PATE queries and teachers) runs outside the source's global
lock: only the charge, the noise and the store hold it. A PATE request held blocked in the
teachers' vote count leaves the lock free, and another session's release completes meanwhile;
one session's teachers do not wait for another's; and a peer past its CPU budget for the
window is refused before any work or charge."""

from __future__ import annotations

import threading
from typing import Any

import grpc
import numpy as np
import pytest

from dpda.dp.ledger import LedgerEntry, head_hash
from dpda.pb import dpda_pb2 as pb
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.service import serde, signing
from dpda.service.config import load_source
from dpda.service.tls import channel_credentials
from dpda.source_party.app import run_server
from dpda.source_party.teachers import TeacherEnsemble
from dpda.terms import SessionTerms

from .helpers import DELTA, SignedStub, synthetic_deployment

TIMEOUT = 60  # bounds a hang; the first PATE answer trains the teachers


def _terms(**kw: Any) -> str:
    base: dict[str, Any] = dict(
        dataset="synthetic", epsilon=4.0, delta=DELTA, projection="jl", projection_dim=5
    )
    base.update(kw)
    return SessionTerms(**base).model_dump_json()


def test_pate_votes_are_counted_outside_the_global_lock(tmp_path, monkeypatch) -> None:
    dep = synthetic_deployment(tmp_path)
    entered, go = threading.Event(), threading.Event()
    real = TeacherEnsemble.votes

    def held(self: TeacherEnsemble, queries: np.ndarray) -> np.ndarray:
        if queries.shape[0] == 7:  # the peer's big request (7 rows here)
            entered.set()
            go.wait(TIMEOUT)
        return real(self, queries)

    monkeypatch.setattr(TeacherEnsemble, "votes", held)
    with run_server(load_source(dep.source_config)) as rs:
        k = dep.target_keys
        creds = channel_credentials(k.cert, k.key, k.ca)
        with grpc.secure_channel(f"127.0.0.1:{rs.port}", creds) as ch:
            stub = SignedStub(pb_grpc.SourceServiceStub(ch), dep)

            def head() -> str:
                return head_hash(rs.handlers.ledger.store.entries("synthetic"))

            pate = stub.OpenSession(
                pb.OpenSessionRequest(
                    terms_json=_terms(
                        dpda=False, pate_epsilon=4.0, pate_queries=20, pate_teachers=5
                    )
                ),
                timeout=TIMEOUT,
            ).session_id
            honest = stub.OpenSession(
                pb.OpenSessionRequest(terms_json=_terms(epsilon=1.0)), timeout=TIMEOUT
            ).session_id
            answer: dict[str, Any] = {}

            def big() -> None:
                n = len(rs.handlers.ledger.store.entries("synthetic"))
                req = pb.QueryTeachersRequest(
                    session_id=pate,
                    queries=serde.to_pb(np.ones((7, 5))),
                    ledger_head=head(),
                    ledger_length=n,  # the release below lands meanwhile: a known prefix
                )
                answer["labels"] = stub.QueryTeachers(req, timeout=TIMEOUT).labels

            th = threading.Thread(target=big)
            th.start()
            try:
                assert entered.wait(TIMEOUT)  # the votes are being counted now
                free = rs.handlers.lock.acquire(blocking=False)
                if free:
                    rs.handlers.lock.release()
                # another session's release completes while the votes are held
                req = pb.ReleaseBatchesRequest(
                    session_id=honest, start=0, count=1, ledger_head=head()
                )
                (msg,) = list(stub.ReleaseBatches(req, timeout=TIMEOUT))
                entry = LedgerEntry.from_json(msg.entry_json)
                sig = signing.sign(stub._key, entry.signed_message())
                stub.Countersign(
                    pb.CountersignRequest(dataset=entry.dataset, seq=entry.seq, target_sig=sig),
                    timeout=TIMEOUT,
                )
                released_while_held = not go.is_set()
            finally:
                go.set()
                th.join(TIMEOUT)
    assert free, "the global lock was held while the peer's votes were counted"
    assert released_while_held and "labels" in answer


def test_one_sessions_teachers_do_not_wait_for_anothers(tmp_path, monkeypatch) -> None:
    """A peer's session of 7 teachers held in training; another session's teachers train
    meanwhile (one lock for every session's training made them wait)."""
    dep = synthetic_deployment(tmp_path)
    entered, go, other_done = threading.Event(), threading.Event(), threading.Event()
    real = TeacherEnsemble.__init__

    def held(self: TeacherEnsemble, x: Any, y: Any, parts: Any, n: int, *a: Any) -> None:
        if n == 7:
            entered.set()
            go.wait(TIMEOUT)
        real(self, x, y, parts, n, *a)

    monkeypatch.setattr(TeacherEnsemble, "__init__", held)
    with run_server(load_source(dep.source_config)) as rs:
        k = dep.target_keys
        creds = channel_credentials(k.cert, k.key, k.ca)
        with grpc.secure_channel(f"127.0.0.1:{rs.port}", creds) as ch:
            stub = SignedStub(pb_grpc.SourceServiceStub(ch), dep)
            sids = [
                stub.OpenSession(
                    pb.OpenSessionRequest(
                        terms_json=_terms(
                            dpda=False, pate_epsilon=4.0, pate_queries=20, pate_teachers=n
                        )
                    ),
                    timeout=TIMEOUT,
                ).session_id
                for n in (7, 5)
            ]
        releaser = rs.handlers.releasers["synthetic"]
        big = threading.Thread(target=releaser.pate.prepare_teachers, args=(sids[0],))
        big.start()
        try:
            assert entered.wait(TIMEOUT)
            other = threading.Thread(
                target=lambda: (releaser.pate.prepare_teachers(sids[1]), other_done.set())
            )
            other.start()
            trained_while_held = other_done.wait(TIMEOUT) and not go.is_set()
        finally:
            go.set()
            big.join(TIMEOUT)
            other.join(TIMEOUT)
    assert trained_while_held


def test_pate_past_the_peers_cpu_budget_is_refused_uncharged(tmp_path) -> None:
    """A peer that used its CPU seconds for the window gets OVERLOADED before any work, charge
    or noise: here its session's plan used them (planning CPU counts against the planning
    peer), so its first PATE request is refused and the ledger holds nothing of it; so is its
    next plan."""
    from dpda.service.config import SourceLimits

    dep = synthetic_deployment(tmp_path)
    cfg = load_source(dep.source_config)
    cfg = cfg.model_copy(update={"limits": SourceLimits(peer_cpu_seconds=1e-9)})
    terms = _terms(dpda=False, pate_epsilon=4.0, pate_queries=20, pate_teachers=5)
    with run_server(cfg) as rs:
        k = dep.target_keys
        creds = channel_credentials(k.cert, k.key, k.ca)
        with grpc.secure_channel(f"127.0.0.1:{rs.port}", creds) as ch:
            stub = SignedStub(pb_grpc.SourceServiceStub(ch), dep)
            # the budget is checked before the work: the first plan runs, and is counted
            sid = stub.OpenSession(
                pb.OpenSessionRequest(terms_json=terms), timeout=TIMEOUT
            ).session_id
            assert rs.handlers.workers.cpu.used(dep.target_keys.fingerprint) > 0
            before = rs.handlers.ledger.store.entries()
            req = pb.QueryTeachersRequest(
                session_id=sid,
                index=0,
                queries=serde.to_pb(np.ones((3, 5))),
                ledger_head=head_hash(before),
                ledger_length=len(before),
            )
            for call in (
                lambda: stub.QueryTeachers(req, timeout=TIMEOUT),
                lambda: stub.OpenSession(pb.OpenSessionRequest(terms_json=terms), timeout=TIMEOUT),
            ):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() == grpc.StatusCode.UNAVAILABLE
                assert e.value.details().startswith("OVERLOADED")
                assert rs.handlers.ledger.store.entries() == before


def _release_while_training_is_held(
    tmp_path, monkeypatch, trainer: str, terms_json: str, index: Any, metric: bool = False
) -> tuple[bool, bool, Any, list[Any], list[LedgerEntry]]:
    """Open a session with ``terms_json``, ask for release ``index(opened)`` while
    ``batch_draws.<trainer>`` is held, and look at the global lock and the ledger meanwhile:
    (lock free, ledger read while held, that ledger, the releases sent, the entries after)."""
    import dpda.source_party.batch_draws as draws

    dep = synthetic_deployment(tmp_path, metric=metric)
    entered, go = threading.Event(), threading.Event()
    real = getattr(draws, trainer)

    def held(*args: Any, **kw: Any) -> Any:
        entered.set()
        go.wait(TIMEOUT)
        return real(*args, **kw)

    monkeypatch.setattr(draws, trainer, held)
    with run_server(load_source(dep.source_config)) as rs:
        k = dep.target_keys
        creds = channel_credentials(k.cert, k.key, k.ca)
        with grpc.secure_channel(f"127.0.0.1:{rs.port}", creds) as ch:
            stub = SignedStub(pb_grpc.SourceServiceStub(ch), dep)
            opened = stub.OpenSession(pb.OpenSessionRequest(terms_json=terms_json), timeout=TIMEOUT)
            got: list[Any] = []

            def release() -> None:
                head = head_hash(rs.handlers.ledger.store.entries("synthetic"))
                req = pb.ReleaseBatchesRequest(
                    session_id=opened.session_id, start=index(opened), count=1, ledger_head=head
                )
                got.extend(stub.ReleaseBatches(req, timeout=TIMEOUT))

            th = threading.Thread(target=release)
            th.start()
            try:
                assert entered.wait(TIMEOUT)  # the release is being trained now
                free = rs.handlers.lock.acquire(blocking=False)
                if free:
                    rs.handlers.lock.release()
                ledger = stub.GetLedger(pb.GetLedgerRequest(dataset="synthetic"), timeout=TIMEOUT)
                read_while_held = not go.is_set()
            finally:
                go.set()
                th.join(TIMEOUT)
        entries = rs.handlers.ledger.store.entries("synthetic")
    return free, read_while_held, ledger, got, entries


def test_the_learned_cost_trains_outside_the_global_lock(tmp_path, monkeypatch) -> None:
    """The learned ground cost's release trains W for as long as the peer's terms make it
    (seconds): it is charged and stored under the global lock and trained outside it, so the
    lock is free and a ledger read completes while the training is held."""
    from dpda.planner import ReleasePlan

    free, read_while_held, ledger, got, entries = _release_while_training_is_held(
        tmp_path,
        monkeypatch,
        "train_metric",
        _terms(cost="metric", metric_dim=4, metric_steps=5),
        lambda opened: ReleasePlan.model_validate_json(opened.plan_json).steps,  # the metric's
        metric=True,
    )
    assert free, "the global lock was held while the learned cost trained"
    assert read_while_held and len(ledger.entries_json) == 1  # the metric's charge, durable
    assert len(got) == 1
    assert [e.params["spec"].get("kind") for e in entries] == ["metric"]  # charged once


def test_synthetic_points_are_drawn_outside_the_global_lock(tmp_path, monkeypatch) -> None:
    """DP-Sinkhorn synthetic points train for as many steps as the peer's terms ask: the
    release is charged and stored under the global lock and trained outside it, so the lock is
    free and a ledger read completes while the training is held; it is charged once."""
    terms = _terms(
        release="sinkhorn-synthetic",
        synthetic_points=2,
        synthetic_rows_per_point=1,
        sinkhorn_steps=4,
    )
    free, read_while_held, ledger, got, entries = _release_while_training_is_held(
        tmp_path, monkeypatch, "train_synthetic", terms, lambda opened: 0
    )
    assert free, "the global lock was held while the synthetic points trained"
    assert read_while_held and len(ledger.entries_json) == 1  # the charge, durable
    assert len(got) == 1
    assert len(entries) == 1 and entries[0].params["spec"]["features"]["steps"] == 4
