"""The source daemon's logic, without gRPC: sessions, charged releases, ledger sync.

Release protocol (DESIGN.md §3), source side, for each batch of a ``ReleaseBatches`` request:

1. the peer is authenticated (mTLS fingerprint → configured peer) and owns the session;
2. the target's ledger head must equal ours for the dataset (else FAILED_PRECONDITION: sync);
3. a retried request id (``session/index``) that already has an entry gets the *stored* payload
   back, uncharged — fresh noise for a retry would be a second release;
4. otherwise the ledger recomputes the charge over all events of the dataset and refuses if the
   dataset, peer or session cap would be exceeded; it durably appends the entry, and only then
   is noise drawn; the payload is stored durably, its hash recorded and signed, then sent.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
from pydantic import ValidationError

from dpda.data.preprocessing import Scaling
from dpda.dp.events import event_from_json
from dpda.dp.ledger import LedgerEntry, PrivacyLedger, head_hash, spend_of
from dpda.errors import (
    InvalidInput,
    LedgerCorrupt,
    Overloaded,
    PeerMisbehaved,
    PolicyRefused,
    TermsInvalid,
)
from dpda.protocol import (
    BatchRelease,
    PateAnswer,
    SessionInfo,
    TargetDisclosure,
    payload_digest,
    queries_digest,
)
from dpda.service import responsive_io_threads, signing
from dpda.service.config import Peer, SourceLimits
from dpda.service.crashpoints import crash_point
from dpda.source_party import reweight_quota
from dpda.source_party import reweighting as RW
from dpda.source_party.peer_cpu import PeerCpuBudget
from dpda.source_party.releases import PreparedSession, SourceReleaser
from dpda.terms import ReweightingTerms, SessionTerms, terms_error

log = logging.getLogger("dpda.source")


T = TypeVar("T", SessionTerms, ReweightingTerms)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY, peer TEXT NOT NULL, dataset TEXT NOT NULL,
    terms_json TEXT NOT NULL, projection BLOB NOT NULL, proj_shape TEXT NOT NULL,
    scaling_mean BLOB, scaling_std BLOB, closed INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS pate_answers (
    dataset TEXT NOT NULL, seq INTEGER NOT NULL, request_id TEXT NOT NULL UNIQUE,
    labels BLOB NOT NULL, PRIMARY KEY (dataset, seq)
);
CREATE TABLE IF NOT EXISTS reweight_answers (
    dataset TEXT NOT NULL, seq INTEGER NOT NULL, request_id TEXT NOT NULL UNIQUE,
    outputs BLOB NOT NULL, PRIMARY KEY (dataset, seq)
);
CREATE TABLE IF NOT EXISTS payloads (
    dataset TEXT NOT NULL, seq INTEGER NOT NULL, request_id TEXT NOT NULL UNIQUE,
    z BLOB NOT NULL, z_rows INTEGER NOT NULL, counts BLOB NOT NULL,
    PRIMARY KEY (dataset, seq)
);
"""


def log_restored(dataset: str, seq: int) -> None:
    logging.getLogger("dpda.source").warning(
        "ledger %s entry %d restored from the peer's countersigned copy", dataset, seq
    )


@dataclass(frozen=True)
class SignedRelease:
    release: BatchRelease
    entry: LedgerEntry  # signed: entry.source_sig
    catch_up: tuple[LedgerEntry, ...] = ()  # entries before it the peer has not been sent yet

    @property
    def source_sig(self) -> str:
        return self.entry.source_sig


def check_target_claim(
    pub: Any, claim: str, scaling: Scaling | None, basis: np.ndarray | None, terms: SessionTerms
) -> None:
    """The target's own ledger entry for the scaling and basis it sends under its own DP
    (issue 19): signed by the target, over exactly these arrays, and charging what its events
    recompute to. The source's guarantee does not rest on it (the target's privacy is the
    target's); checking it lets the source's log say what the target spent, truthfully."""
    try:
        entry = LedgerEntry.from_json(claim)
        events = event_from_json(entry.dp_event)
        delta = float(entry.params["delta"])
        claimed = float(entry.params["epsilon"])
        message = entry.signed_message()  # canonical JSON: refuses NaN and ∞ anywhere
    except (ValueError, TypeError, KeyError, AttributeError):
        raise PeerMisbehaved("the target's disclosure claim is malformed") from None
    if entry.params.get("kind") != "target-disclosure" or scaling is None:
        raise PeerMisbehaved("the target's disclosure claim is not for this session")
    if not signing.verify(pub, message, entry.target_sig):
        raise PeerMisbehaved("the target's disclosure claim is not signed by the peer's key")
    k = scaling.mean.shape[0]
    b = basis if basis is not None else np.zeros((k, 0))
    parts = (scaling.mean, scaling.std, b)
    digest = payload_digest(*(np.ascontiguousarray(a, dtype="<f8").tobytes() for a in parts))
    if digest != entry.payload_sha256:
        raise PeerMisbehaved("the target's disclosure claim is for other arrays")
    try:
        recomputed = spend_of([events], delta) if 0 < delta < 1 else math.nan
    except (ValueError, TypeError, OverflowError):
        recomputed = math.nan
    # NaN never compares: a claimed or recomputed NaN (or ∞) is refused, never waved through
    if not (math.isfinite(claimed) and abs(recomputed - claimed) <= 1e-9):
        raise PeerMisbehaved("the target's disclosure claim does not recompute")
    logging.getLogger("dpda.source").info(
        "the target released its scaling%s under its own DP: ε %.4g at δ %.3g",
        " and basis" if basis is not None else "",
        claimed,
        delta,
    )


class SourceHandlers:
    def __init__(
        self,
        conn: sqlite3.Connection,
        ledger: PrivacyLedger,
        releasers: dict[str, SourceReleaser],
        signing_key: signing.Ed25519PrivateKey,
        peers: dict[str, Peer],
        max_batches_per_request: int = 1000,
        limits: SourceLimits | None = None,
    ) -> None:
        self.conn = conn
        self.conn.executescript(_SCHEMA)
        self.ledger = ledger
        self.releasers = releasers
        self.key = signing_key
        self.peers = peers
        self.max_batches = max_batches_per_request
        self.limits = limits or SourceLimits()
        self.lock = threading.RLock()  # one release at a time: the charge check must be atomic
        # plans (calibrations) run outside the lock, a few at a time, each under a time limit
        self.planning = threading.BoundedSemaphore(max(1, self.limits.workers // 4))
        # the work a peer sizes (teachers, votes, hints): CPU seconds per peer and window
        self.cpu = PeerCpuBudget(self.limits.peer_cpu_seconds, self.limits.peer_cpu_window_s)
        self.last_used: dict[str, float] = {}  # session → monotonic time of its last use
        # reverse-deployment sessions (seed 001): in memory; after a restart the peer opens a
        # new one (the charges already made stay in the ledger and keep counting)
        self.reweighting: dict[str, RW.ReweightingSession] = {}
        # a new session's first release computed ahead, outside the lock (``_warm``): one at a
        # time; an open that finds the worker busy is not warmed (its release does the work)
        self._warmer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpda-warm")
        self._warmer.submit(lambda: None)  # its thread started now, not inside an OpenSession
        responsive_io_threads()
        self._warm_slot = threading.BoundedSemaphore(1)
        # planned terms (``DescribeDataset``) on a worker of their own: a hint never delays or
        # displaces a session's warm-up, which its release waits for
        self._planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpda-plan-ahead")
        self._plan_slot = threading.BoundedSemaphore(1)
        self._warming: dict[str, Future[None]] = {}
        self._warm_lock = threading.Lock()  # guards ``_warming``: taken last, for a dict op only

    # ------------------------------------------------------------------------- preflight
    def describe(self, peer: str, dataset: str, planned_terms_json: str = "") -> dict[str, Any]:
        """The public facts of a dataset for a pinned peer (``DescribeDataset``): its shape, the
        policy, δ, and the budget numbers against both caps that bind this peer. With
        ``planned_terms_json`` (the terms the peer means to open a session under), their plan
        and first charge are composed ahead in the background (``_warm_plan``)."""
        releaser = self.releasers.get(dataset)
        if releaser is None:
            raise InvalidInput("unknown dataset", public=True)
        planned = None
        if planned_terms_json:
            try:
                planned = SessionTerms.model_validate_json(planned_terms_json)
            except ValidationError as exc:
                raise TermsInvalid(f"planned_terms_json: {terms_error(exc)}") from None
            if planned.dataset != dataset:
                raise InvalidInput(
                    "planned_terms_json: its dataset is not the one described", public=True
                )
        with self.lock:
            entries = self.ledger.store.entries(dataset)
        budget = self.ledger.budgets[dataset]
        name = self.peers[peer].name
        spent = spend_of([event_from_json(e.dp_event) for e in entries], budget.delta)
        mine = [event_from_json(e.dp_event) for e in entries if e.peer == name]
        peer_spent = spend_of(mine, budget.delta)
        cap = self.peers[peer].epsilon_cap
        d = releaser.domain
        facts = {
            "n_rows": d.x.shape[0],
            "n_features": d.x.shape[1],
            "n_classes": d.n_classes,
            "representation": releaser.representation,
            "policy_json": releaser.policy.model_dump_json(),
            "delta": budget.delta,
            "dataset_epsilon_cap": budget.epsilon,
            "dataset_epsilon_spent": spent,
            "peer_epsilon_cap": cap,
            "peer_epsilon_spent": peer_spent,
            "epsilon_remaining": max(0.0, min(budget.epsilon - spent, cap - peer_spent)),
        }
        if planned is not None:
            self._warm_plan(peer, releaser, planned)
        return facts

    def _warm_plan(self, peer: str, releaser: SourceReleaser, terms: SessionTerms) -> None:
        """``SourceReleaser.warm_plan`` in the background, while the peer computes its basis
        (on the short Office-Caltech job the first charge's composition otherwise ran between
        ``OpenSession`` and the first release: 18 ms that the release waited for, with every
        I/O thread slowed meanwhile). Bounded below a session's own warm-up: one hint at a
        time, on a worker of its own (a hint that finds it busy is dropped, so one peer's slow
        hints cost the others only their head start, never a session's warm-up); plan and
        composition under ``plan_seconds``; none for a peer at its session limit, which could
        not open the session. Only caches change; a failure is the later ``OpenSession``'s to
        report."""
        with self.lock:
            full = self._open_sessions(peer) >= self.limits.sessions_per_peer
        if full or self.cpu.used(peer) >= self.cpu.seconds:
            return  # a hint is only a head start: a peer over its CPU budget gets none
        if not self._plan_slot.acquire(blocking=False):
            return

        def run() -> None:
            try:
                caps = [self._peer_cap(peer, releaser.dataset)]
                with self.cpu.spend(peer):
                    releaser.warm_plan(terms, caps, self.limits.plan_seconds)
            except Exception:  # only caches: OpenSession checks and reports for itself
                log.debug("planning ahead for %s failed", self.peers[peer].name, exc_info=True)
            finally:
                self._plan_slot.release()

        self._planner.submit(run)

    # -------------------------------------------------------------------------- sessions
    def _plan(
        self,
        releaser: SourceReleaser,
        terms: SessionTerms,
        disclosure: TargetDisclosure,
        projection: np.ndarray | None = None,
    ) -> PreparedSession:
        """Policy checks and the release plan, outside the lock, a few at a time, time-limited
        (on 9ac3bc1 one 10⁷-step calibration held the lock for 153 s)."""
        if not self.planning.acquire(blocking=False):
            raise Overloaded("every planning slot is busy")
        try:
            return releaser.prepare(terms, disclosure, projection, self.limits.plan_seconds)
        finally:
            self.planning.release()

    def open_session(
        self,
        peer: str,
        terms_json: str,
        scaling: Scaling | None,
        basis: np.ndarray | None,
        session_id: str = "",
        target_sig: str = "",
        target_claim: str = "",
    ) -> tuple[SessionInfo, str, str]:
        pub, terms = self._signed_terms(peer, terms_json, target_sig, SessionTerms)
        if target_claim:
            check_target_claim(pub, target_claim, scaling, basis, terms)
        releaser = self.releasers.get(terms.dataset)
        if releaser is None:
            raise InvalidInput("unknown dataset", public=True)
        if session_id:
            releaser, info = self._session(peer, session_id)
            stored = releaser.session(info.session_id)[0]
            if stored != terms:
                raise InvalidInput("a resumed session must keep its terms")
        else:
            with self.lock:
                self._expire_idle()
                self._check_session_limit(peer)
            prepared = self._plan(releaser, terms, TargetDisclosure(scaling, basis))
            with self.lock:
                self._check_session_limit(peer)  # checked again: another open may have won
                sid = uuid.uuid4().hex
                info = releaser.install(prepared, sid)
                self._store_session(peer, terms, info, scaling)
                crash_point("source.open_session.stored")
                self.last_used[sid] = time.monotonic()
            self._warm(peer, releaser, sid)
        plan_json = info.plan.model_dump_json()
        sig = signing.sign(self.key, (terms.model_dump_json() + plan_json).encode())
        return info, plan_json, sig

    def _peer_cap(self, peer: str, dataset: str) -> tuple[str, float, list[Any]]:
        """The peer's cap on ``dataset`` as the ledger checks it: (name, ε cap, the events of
        the peer's entries so far)."""
        name = self.peers[peer].name
        entries = self.ledger.store.entries(dataset)
        prior = [event_from_json(e.dp_event) for e in entries if e.peer == name]
        return "peer", self.peers[peer].epsilon_cap, prior

    def _warm(self, peer: str, releaser: SourceReleaser, sid: str, index: int = 0) -> None:
        """``SourceReleaser.warm_charge`` for the session's release ``index``, in the
        background: after OpenSession, while the target reads the plan; after a release, while
        it fits that one. The release waits for it (outside the lock) and then finds its
        charge's ε composed. One warm-up at a time: an open or a release that finds one running
        is not warmed (its release does the work)."""
        if not self._warm_slot.acquire(blocking=False):
            return

        def run() -> None:
            try:
                releaser.warm_charge(sid, [self._peer_cap(peer, releaser.dataset)], index)
            except Exception:  # only caches: the release computes (and reports) for itself
                log.debug("warming session %s failed", sid, exc_info=True)
            finally:
                self._warm_slot.release()

        with self._warm_lock:
            self._warming[sid] = self._warmer.submit(run)

    def _await_warm(self, sid: str) -> None:
        with self._warm_lock:
            pending = self._warming.pop(sid, None)
        if pending is not None:
            pending.result()

    def _signed_terms(
        self, peer: str, terms_json: str, target_sig: str, model: type[T]
    ) -> tuple[Any, T]:
        """The peer's key and its terms: signed by that key, then valid (the error names the
        field)."""
        pub = signing.load_public(self.peers[peer].signing_public_key)
        if not signing.verify(pub, terms_json.encode(), target_sig):
            raise PeerMisbehaved("the session terms are not signed by the peer's key")
        try:
            return pub, model.model_validate_json(terms_json)
        except ValidationError as exc:
            raise TermsInvalid(terms_error(exc)) from None

    def _open_sessions(self, peer: str) -> int:
        (n,) = self.conn.execute(
            "SELECT COUNT(*) FROM sessions WHERE peer=? AND closed=0", (peer,)
        ).fetchone()
        return int(n)

    def _check_session_limit(self, peer: str) -> None:
        cap = self.limits.sessions_per_peer
        if self._open_sessions(peer) >= cap:
            raise PolicyRefused(f"this peer has {cap} open sessions, the limit: close one first")

    def _expire_idle(self) -> None:
        """Close sessions unused for ``session_idle_s`` (sessions restored after a restart
        count from the restart)."""
        now = time.monotonic()
        rows = self.conn.execute("SELECT session_id, dataset FROM sessions WHERE closed=0")
        for sid, ds in rows.fetchall():
            last = self.last_used.setdefault(sid, now)
            if now - last > self.limits.session_idle_s:
                self.conn.execute("UPDATE sessions SET closed=1 WHERE session_id=?", (sid,))
                self.releasers[ds].close_session(sid)
                self.last_used.pop(sid, None)
                with self._warm_lock:
                    self._warming.pop(sid, None)

    def _store_session(
        self, peer: str, terms: SessionTerms, info: SessionInfo, scaling: Scaling | None
    ) -> None:
        m = np.ascontiguousarray(info.projection, dtype="<f8")
        self.conn.execute(
            "INSERT INTO sessions VALUES (?, ?, ?, ?, ?, ?, ?, ?, 0)",
            (
                info.session_id,
                peer,
                terms.dataset,
                terms.model_dump_json(),
                m.tobytes(),
                json.dumps(list(m.shape)),
                None if scaling is None else np.ascontiguousarray(scaling.mean, "<f8").tobytes(),
                None if scaling is None else np.ascontiguousarray(scaling.std, "<f8").tobytes(),
            ),
        )

    def _session(self, peer: str, session_id: str) -> tuple[SourceReleaser, SessionInfo]:
        """The peer's open session; one that is not in memory (after a restart) is rebuilt from
        its stored terms, projection and disclosure — planned outside the lock."""
        with self.lock:
            row = self.conn.execute(
                "SELECT peer, dataset, terms_json, projection, proj_shape, scaling_mean,"
                " scaling_std, closed FROM sessions WHERE session_id=?",
                (session_id,),
            ).fetchone()
            if row is None or row[0] != peer or row[7]:
                raise InvalidInput("unknown or closed session")
            releaser = self.releasers[row[1]]
            self.last_used[session_id] = time.monotonic()
            if releaser.resident(session_id):
                return releaser, releaser.session(session_id)[1]
        terms = SessionTerms.model_validate_json(row[2])
        m = np.frombuffer(row[3], dtype="<f8").reshape(json.loads(row[4]))
        scaling = None
        if row[5] is not None:
            scaling = Scaling(np.frombuffer(row[5], "<f8"), np.frombuffer(row[6], "<f8"))
        prepared = self._plan(releaser, terms, TargetDisclosure(scaling, None), m)
        with self.lock:
            if not releaser.resident(session_id):
                releaser.install(prepared, session_id)
            return releaser, releaser.session(session_id)[1]

    def projection(self, peer: str, session_id: str) -> np.ndarray:
        return self._session(peer, session_id)[1].projection

    def close_session(self, peer: str, session_id: str) -> list[int]:
        """Close; returns the seqs of the peer's releases (of the session's dataset) that lack
        its countersignature, so the last one of a job is reconciled before the job ends."""
        rs = self.reweighting.get(session_id)
        if rs is not None and rs.peer == peer:
            with self.lock:
                self.reweighting.pop(session_id, None)
                return self._uncountersigned(rs.dataset, self.peers[peer].name)
        releaser, _ = self._session(peer, session_id)
        with self.lock:
            self.conn.execute("UPDATE sessions SET closed=1 WHERE session_id=?", (session_id,))
            releaser.close_session(session_id)
            self.last_used.pop(session_id, None)
            with self._warm_lock:
                self._warming.pop(session_id, None)
            return self._uncountersigned(releaser.dataset, self.peers[peer].name)

    def _uncountersigned(self, dataset: str, name: str) -> list[int]:
        """The peer's entries we hold without both signatures: sent and not yet countersigned,
        or (after losing writes) held here without a signature they had when they left — the
        peer's doubly-signed copy of those comes back through ``RestoreLedger``. (Entries
        charged and never sent are listed too; the peer, holding them unsigned, skips them.)"""
        return [
            e.seq
            for e in self.ledger.store.entries(dataset)
            if e.peer == name and not (e.source_sig and e.target_sig)
        ]

    def _complete(self, mine: LedgerEntry, theirs: LedgerEntry) -> None:
        """Fill in the payload hash and signatures of an entry we hold incompletely (we lost
        the writes that stored them) from the peer's doubly-signed copy (verified by the
        caller). A field we hold must be the one they hold: else the release was drawn twice."""
        fields = ("payload_sha256", "source_sig", "target_sig")
        if all(getattr(mine, f) == getattr(theirs, f) for f in fields):
            return
        if any(getattr(mine, f) not in ("", getattr(theirs, f)) for f in fields):
            raise LedgerCorrupt("a restored entry conflicts with the one held here")
        self.ledger.store.update_signatures(
            mine.dataset, mine.seq, theirs.payload_sha256, theirs.source_sig, theirs.target_sig
        )
        log_restored(mine.dataset, mine.seq)

    # -------------------------------------------------------------------------- releases
    def release_batches(
        self,
        peer: str,
        session_id: str,
        start: int,
        count: int,
        ledger_head: str,
        ledger_length: int = -1,
    ) -> Iterator[SignedRelease]:
        if count < 1 or count > self.max_batches or start < 0:
            raise InvalidInput("batch range out of bounds")
        releaser, info = self._session(peer, session_id)
        if start + count > info.plan.releases:
            raise InvalidInput("batch range out of bounds")
        self._await_warm(session_id)  # outside the lock: the work it did is not done twice
        with self.lock:
            known = self._known_prefix(releaser.dataset, ledger_head, ledger_length)
        call = {f"{session_id}/{i}" for i in range(start, start + count)}
        for index in range(start, start + count):
            with self.lock:  # charge, draw and store atomically; send outside the lock
                signed = self._release_one(peer, releaser, session_id, index, call)
                signed, known = self._with_catch_up(releaser.dataset, signed, known)
                crash_point("source.release.signed")
            yield signed
        # the last one is on its way (gRPC asks for more once it has sent it): the session's
        # next release is composed while the target fits this one
        self._warm(peer, releaser, session_id, start + count)

    def _known_prefix(self, dataset: str, ledger_head: str, ledger_length: int) -> int:
        """How many of the dataset's entries the peer holds: its head must be our head, or the
        hash of our entry ``ledger_length - 1`` (it lags because other sessions released
        meanwhile; the entries it lacks travel with the release, ``catch_up``). Anything else:
        sync first."""
        entries = self.ledger.store.entries(dataset)
        if ledger_head == head_hash(entries):
            return len(entries)
        if 0 <= ledger_length <= len(entries) and ledger_head == head_hash(entries[:ledger_length]):
            return ledger_length
        raise LedgerCorrupt("ledger heads differ: sync the ledger first")

    def _with_catch_up(
        self, dataset: str, signed: SignedRelease, known: int
    ) -> tuple[SignedRelease, int]:
        seq = signed.entry.seq
        if seq <= known:
            return signed, max(known, seq + 1)
        gap = tuple(self.ledger.store.entries(dataset)[known:seq])
        return dataclasses.replace(signed, catch_up=gap), seq + 1

    def _require_countersigned(self, dataset: str, name: str, call: set[str]) -> None:
        """A new charge waits until the peer has countersigned every earlier release of its own
        (those of the current call aside): the source never runs ahead of the head the target
        acknowledged (a target that lost a countersignature re-sends it when it syncs)."""
        for e in self.ledger.store.entries(dataset):
            if e.peer == name and e.payload_sha256 and not e.target_sig:
                if e.request_id not in call:
                    raise LedgerCorrupt("countersign the earlier releases first: sync the ledger")

    def _release_one(
        self, peer: str, releaser: SourceReleaser, session_id: str, index: int, call: set[str]
    ) -> SignedRelease:
        rid = f"{session_id}/{index}"
        ds = releaser.dataset
        existing = next((e for e in self.ledger.store.entries(ds) if e.request_id == rid), None)
        if existing is not None:
            stored = self._stored_payload(ds, existing, releaser, session_id, index)
            if stored is not None:
                return SignedRelease(stored, self._sign(ds, existing.seq))
            if existing.source_sig:
                # signed, so its payload was stored and sent before the source lost it (the
                # entry came back from the peer's copy): a new draw would be a second release
                raise LedgerCorrupt(
                    "this release was sent before and its stored copy is lost: it cannot be "
                    "sent again (a second draw would be a second release)",
                    public=True,
                )
            # Entry durable but payload never stored: it never left. Draw it now, uncharged.
            rel = releaser.draw(session_id, index, existing)
        else:
            name = self.peers[peer].name
            self._require_countersigned(ds, name, call)
            rel = releaser.release(
                session_id, index, peer=name, extra_caps=[self._peer_cap(peer, ds)]
            )
        crash_point("source.release.drawn")
        self._store_payload(ds, rel, rid)
        crash_point("source.release.stored")
        return SignedRelease(rel, self._sign(ds, rel.ledger_seq))

    def _store_payload(self, dataset: str, rel: BatchRelease, rid: str) -> None:
        self.conn.execute(
            "INSERT INTO payloads VALUES (?, ?, ?, ?, ?, ?)",
            (
                dataset,
                rel.ledger_seq,
                rid,
                np.ascontiguousarray(rel.z, "<f8").tobytes(),
                rel.z.shape[0],
                np.ascontiguousarray(rel.noisy_counts, "<i8").tobytes(),
            ),
        )

    def _stored_payload(
        self,
        dataset: str,
        entry: LedgerEntry,
        releaser: SourceReleaser,
        session_id: str,
        index: int,
    ) -> BatchRelease | None:
        row = self.conn.execute(
            "SELECT z, z_rows, counts FROM payloads WHERE dataset=? AND seq=?",
            (dataset, entry.seq),
        ).fetchone()
        if row is None:
            return None
        terms, info = releaser.session(session_id)
        z = np.frombuffer(row[0], "<f8").reshape(row[1], -1)
        return BatchRelease(
            index, z, np.frombuffer(row[2], "<i8"), info.plan.release_spec(terms, index), entry.seq
        )

    def _sign(self, dataset: str, seq: int) -> LedgerEntry:
        """The entry, signed by the source (signing once; a retry gets the same signature)."""
        entry = self.ledger.store.entries(dataset)[seq]
        if not entry.source_sig:
            sig = signing.sign(self.key, entry.signed_message())
            self.ledger.store.update_signatures(dataset, seq, "", sig, "")
            entry = self.ledger.store.entries(dataset)[seq]
        return entry

    # ------------------------------------------------------------------------------ PATE
    def query_teachers(
        self,
        peer: str,
        session_id: str,
        index: int,
        queries: np.ndarray,
        ledger_head: str,
        ledger_length: int = -1,
    ) -> tuple[PateAnswer, LedgerEntry, tuple[LedgerEntry, ...]]:
        if index < 0:
            raise InvalidInput("query index out of bounds")
        releaser, _ = self._session(peer, session_id)
        releaser.check_queries(session_id, queries)
        with self.cpu.spend(peer):  # refused before any work once the peer's budget is used
            releaser.prepare_teachers(session_id)  # training outside the lock (seconds)
            # the votes too: their cost grows with the peer's queries and teachers (100,000
            # queries to 600 teachers held the lock about 6 s); only the charge, the noise and
            # the store need it
            votes = releaser.votes(session_id, queries)
        with self.lock:
            ds = releaser.dataset
            entries = self.ledger.store.entries(ds)
            rid = f"{session_id}/pate/{index}"
            existing = next((e for e in entries if e.request_id == rid), None)
            known: int | None = None
            if existing is not None:
                if existing.params.get("queries_sha256") != queries_digest(queries):
                    raise InvalidInput("a replayed request id with altered content")
                row = self.conn.execute(
                    "SELECT labels FROM pate_answers WHERE dataset=? AND seq=?",
                    (ds, existing.seq),
                ).fetchone()
                if row is not None:
                    ans = PateAnswer(np.frombuffer(row[0], "<i8"), existing.seq)
                    return ans, self._sign(ds, existing.seq), ()
                if existing.source_sig:  # sent before the source lost it: never draw again
                    raise LedgerCorrupt(
                        "this answer was sent before and its stored copy is lost: it cannot be "
                        "sent again",
                        public=True,
                    )
                ans = releaser.draw_answer(session_id, queries, existing, votes)
            else:
                known = self._known_prefix(ds, ledger_head, ledger_length)
                name = self.peers[peer].name
                self._require_countersigned(ds, name, set())
                ans = releaser.answer(
                    session_id,
                    index,
                    queries,
                    peer=name,
                    extra_caps=[self._peer_cap(peer, ds)],
                    votes=votes,
                )
            crash_point("source.pate.drawn")
            self.conn.execute(
                "INSERT INTO pate_answers VALUES (?, ?, ?, ?)",
                (ds, ans.ledger_seq, rid, ans.payload_bytes()),
            )
            crash_point("source.pate.stored")
            gap = tuple(entries[known : ans.ledger_seq]) if known is not None else ()
            return ans, self._sign(ds, ans.ledger_seq), gap

    # ------------------------------------------------------- reweighting (the reverse shape)
    def open_reweighting(
        self,
        peer: str,
        terms_json: str,
        rows: np.ndarray,
        labels: np.ndarray | None,
        scaling: Scaling,
        basis: np.ndarray,
        scale: float,
        session_id: str = "",
        target_sig: str = "",
    ) -> tuple[RW.ReweightingSession, str, str]:
        """A reweighting session on this daemon's rows (``source_party.reweighting``): checks
        and the plan; nothing charged. Returns (session, plan JSON, our signature)."""
        _, terms = self._signed_terms(peer, terms_json, target_sig, ReweightingTerms)
        releaser = self.releasers.get(terms.dataset)
        if releaser is None:
            raise InvalidInput("unknown dataset", public=True)
        existing = self.reweighting.get(session_id) if session_id else None
        if session_id and (existing is None or existing.peer != peer):
            raise InvalidInput("unknown or closed session")
        if existing is not None:
            if existing.terms != terms or existing.rows_sha256 != RW.rows_digest(rows, labels):
                raise InvalidInput("a resumed session must keep its terms and rows")
            rs = existing
        else:
            with self.lock:
                self._reweighting_limit(peer)
            if not self.planning.acquire(blocking=False):
                raise Overloaded("every planning slot is busy")
            try:
                rs = RW.prepare(
                    releaser, uuid.uuid4().hex, peer, terms, rows, labels, scaling, basis, scale
                )
            finally:
                self.planning.release()
            with self.lock:
                self._reweighting_limit(peer)  # again: another open may have won meanwhile
                self.reweighting[rs.session_id] = rs
        plan_json = rs.plan.model_dump_json()
        sig = signing.sign(self.key, (terms.model_dump_json() + plan_json).encode())
        return rs, plan_json, sig

    def _reweighting_limit(self, peer: str) -> None:
        """Expire idle reweighting sessions, then refuse past ``sessions_per_peer`` (under the
        lock)."""
        now = time.monotonic()
        for sid, s in list(self.reweighting.items()):
            if now - s.last_used > self.limits.session_idle_s:
                self.reweighting.pop(sid, None)
        mine = sum(1 for s in self.reweighting.values() if s.peer == peer)
        if mine >= self.limits.sessions_per_peer:
            raise PolicyRefused(f"this peer has {mine} open reweighting sessions, the limit")

    def reweight_steps(
        self,
        peer: str,
        session_id: str,
        start: int,
        count: int,
        ledger_head: str,
        ledger_length: int = -1,
    ) -> tuple[np.ndarray, LedgerEntry, tuple[LedgerEntry, ...]]:
        """Steps ``start … start+count−1`` of a reweighting session, as PATE answers are: a
        retried request gets the stored outputs back; a new one is charged (dataset, peer and
        session caps) before the holder's rows are read, and its outputs stored, hashed and
        signed before they leave."""
        rs = self.reweighting.get(session_id)
        if rs is None or rs.peer != peer:
            raise InvalidInput("unknown or closed session")
        releaser = self.releasers[rs.dataset]
        RW.check_block(rs, releaser.policy.max_reweighting_work, start, count)
        with rs.lock:  # one block of a session at a time; the draw holds no global lock
            rs.last_used = time.monotonic()
            ds = rs.dataset
            rid = f"{session_id}/reweight/{start}"
            known: int | None = None
            with self.lock:
                entries = self.ledger.store.entries(ds)
                existing = next((e for e in entries if e.request_id == rid), None)
                if existing is not None:
                    if existing.params.get("count") != count:
                        raise InvalidInput("a replayed request id with altered content")
                    row = self.conn.execute(
                        "SELECT outputs FROM reweight_answers WHERE dataset=? AND seq=?",
                        (ds, existing.seq),
                    ).fetchone()
                    if row is not None:
                        out = self._reweight_outputs(rs, row[0], count)
                        return out, self._sign(ds, existing.seq), ()
                    if existing.source_sig or rs.opt.t != start:
                        raise LedgerCorrupt(
                            "these steps were charged and their outputs are lost: they cannot "
                            "be sent again",
                            public=True,
                        )
                    entry = existing
                else:
                    self._check_reweight_room(rs, peer, entries, count)  # before any charge
                    entry, known = self._charge_reweighting(rs, peer, rid, start, count, entries,
                                                            ledger_head, ledger_length)  # fmt: skip
            crash_point("source.reweight.charged")
            out = RW.draw(rs, count)  # after the charge is durable; other sessions go on
            blob = np.ascontiguousarray(out).tobytes()
            with self.lock:
                self.conn.execute(
                    "INSERT INTO reweight_answers VALUES (?, ?, ?, ?)", (ds, entry.seq, rid, blob)
                )
                self.ledger.store.update_signatures(ds, entry.seq, payload_digest(blob), "", "")
                crash_point("source.reweight.stored")
                now = self.ledger.store.entries(ds)
                gap = tuple(now[known : entry.seq]) if known is not None else ()
                return out, self._sign(ds, entry.seq), gap

    def _check_reweight_room(
        self, rs: RW.ReweightingSession, peer: str, entries: list[LedgerEntry], count: int
    ) -> None:
        """The block's outputs must fit the session's and the peer's storage (under the lock)."""
        name = self.peers[peer].name
        mine = [e for e in entries if e.peer == name and "/reweight/" in e.request_id]
        session = [e.seq for e in mine if e.session == rs.session_id]
        new = count * reweight_quota.step_bytes(rs.terms.method, int(rs.opt.q.size))
        reweight_quota.check(
            new,
            reweight_quota.stored_bytes(self.conn, rs.dataset, session),
            reweight_quota.stored_bytes(self.conn, rs.dataset, [e.seq for e in mine]),
            self.limits.reweight_bytes_per_session,
            self.limits.reweight_bytes_per_peer,
        )

    def _charge_reweighting(
        self,
        rs: RW.ReweightingSession,
        peer: str,
        rid: str,
        start: int,
        count: int,
        entries: list[LedgerEntry],
        ledger_head: str,
        ledger_length: int,
    ) -> tuple[LedgerEntry, int]:
        """Charge a new block (under the lock): dataset, peer and session caps."""
        if rs.opt.t != start:
            raise InvalidInput(f"start: the session has taken {rs.opt.t} steps", public=True)
        ds = rs.dataset
        known = self._known_prefix(ds, ledger_head, ledger_length)
        name = self.peers[peer].name
        self._require_countersigned(ds, name, set())
        prior_peer = [event_from_json(e.dp_event) for e in entries if e.peer == name]
        prior_session = [event_from_json(e.dp_event) for e in entries if e.session == rs.session_id]
        entry = self.ledger.charge(
            dataset=ds,
            events=[rs.plan.event(count)],
            session=rs.session_id,
            peer=name,
            request_id=rid,
            privacy_unit="record",
            neighbouring="replace-one",
            params={
                "kind": "reweighting",
                "method": rs.terms.method,
                "start": start,
                "count": count,
                "step_parameter": rs.plan.step_parameter,
                "sensitivity": rs.sensitivity,
                "rows_sha256": rs.rows_sha256,
                "delta": self.ledger.budgets[ds].delta,
                **({"insecure_seed": True} if self.releasers[ds].insecure_seed else {}),
            },
            extra_caps=[
                ("session", rs.terms.epsilon, prior_session),
                ("peer", self.peers[peer].epsilon_cap, prior_peer),
            ],
        )
        return entry, known

    @staticmethod
    def _reweight_outputs(rs: RW.ReweightingSession, blob: bytes, count: int) -> np.ndarray:
        if rs.terms.method == "noisy-md":
            return np.frombuffer(blob, "<f8").reshape(count, rs.opt.x.shape[0])
        return np.frombuffer(blob, "<i8")

    # ------------------------------------------------------------------------ ledger sync
    def countersign(self, peer: str, dataset: str, seq: int, target_sig: str) -> None:
        with self.lock:
            entries = self.ledger.store.entries(dataset)
            if not (0 <= seq < len(entries)) or entries[seq].peer != self.peers[peer].name:
                raise InvalidInput("no such ledger entry for this peer")
            if not entries[seq].payload_sha256:
                # charged here, but the write that recorded its payload was lost (the peer
                # holds it signed): the peer sends its copy back (RestoreLedger) instead
                raise InvalidInput("this entry has no payload record here: restore it")
            pub = signing.load_public(self.peers[peer].signing_public_key)
            if not signing.verify(pub, entries[seq].signed_message(), target_sig):
                raise PeerMisbehaved("countersignature does not verify")
            # the peer countersigned what it received, so it left signed by us: if we lost our
            # signature's write, sign again (Ed25519 is deterministic: the same signature)
            self._sign(dataset, seq)
            self.ledger.store.update_signatures(dataset, seq, "", "", target_sig)
            crash_point("source.countersign.stored")

    def ledger_entries(
        self, peer: str, dataset: str, since: int
    ) -> tuple[list[str], int, str, list[int]]:
        """(entries from ``since``, the source's length and head, and the seqs of the peer's own
        releases it has not countersigned yet — so that a target that lost a countersignature
        can send it again)."""
        if dataset not in self.releasers:
            raise InvalidInput("unknown dataset", public=True)
        if since < 0:
            raise InvalidInput("sequence number out of bounds")
        with self.lock:
            entries = self.ledger.store.entries(dataset)
            pending = self._uncountersigned(dataset, self.peers[peer].name)
        return [e.to_json() for e in entries[since:]], len(entries), head_hash(entries), pending

    def restore_ledger(self, peer: str, dataset: str, entries_json: list[str]) -> tuple[int, str]:
        """Take back entries this source lost (a truncated tail, a lost WAL) from the peer's
        copy: each must link to our head, carry our own signature and the peer's
        countersignature, and be the peer's own. Nothing is charged or released again; a retried
        request for a restored entry whose payload is gone is refused (it left once)."""
        if dataset not in self.releasers:
            raise InvalidInput("unknown dataset", public=True)
        name = self.peers[peer].name
        peer_pub = signing.load_public(self.peers[peer].signing_public_key)
        own_pub = self.key.public_key()
        with self.lock:
            for text in entries_json:
                try:
                    entry = LedgerEntry.from_json(text)
                    # canonical JSON refuses NaN/Infinity (json.loads accepts them); deep nesting
                    # exhausts the recursion limit: both are malformed entries, not internal errors
                    msg = entry.signed_message()
                    sigs = (entry.source_sig, entry.target_sig)
                    if not all(isinstance(sig, str) for sig in sigs):  # null, a number …
                        raise TypeError("signatures are base64 strings")
                except (ValueError, TypeError, RecursionError):
                    raise InvalidInput("a restored entry does not parse") from None
                if entry.dataset != dataset or entry.peer != name:
                    raise PeerMisbehaved("a restored entry is not this peer's")
                if not (
                    signing.verify(own_pub, msg, entry.source_sig)
                    and signing.verify(peer_pub, msg, entry.target_sig)
                ):
                    raise PeerMisbehaved("a restored entry is not signed by both parties")
                mine = self.ledger.store.entries(dataset)
                if entry.seq < len(mine) and mine[entry.seq].entry_hash() == entry.entry_hash():
                    self._complete(mine[entry.seq], entry)  # there; the signatures maybe not
                    continue
                self.ledger.store.append(entry)  # LedgerCorrupt unless it links to our head
                log_restored(dataset, entry.seq)
            entries = self.ledger.store.entries(dataset)
        return len(entries), head_hash(entries)
