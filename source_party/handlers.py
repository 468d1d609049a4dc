"""The source daemon's logic, without gRPC: sessions, charged releases, ledger sync.

Release protocol (docs/architecture.md, "A release's path"), source side, for each batch of a
``ReleaseBatches`` request:

1. the peer is authenticated (mTLS fingerprint → configured peer) and owns the session;
2. the target's ledger head must equal ours for the dataset (else FAILED_PRECONDITION: sync);
3. a retried request id (``session/index``) that already has an entry gets the *stored* payload
   back, uncharged — fresh noise for a retry would be a second release;
4. otherwise the ledger recomputes the charge over all events of the dataset and refuses if the
   dataset, peer or session cap would be exceeded; it durably appends the entry, and only then
   is noise drawn; the payload is stored durably, its hash recorded and signed, then sent.

PATE answers and reweighting blocks take the same steps (``replay.replay_or_charge``).
``SourceHandlers`` composes the parts, one module each: the tables (``store``), the source's
side of the ledger (``ledger_desk``), the background workers (``workers``), and the RPC
families (``rpc_sessions``, ``rpc_batches``, ``rpc_pate``, ``rpc_reweighting``,
``rpc_ledger``).
"""

from __future__ import annotations

import functools
import sqlite3
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from dpda.data.preprocessing import Scaling
from dpda.dp.ledger import LedgerEntry, PrivacyLedger
from dpda.protocol import PateAnswer, SessionInfo, TargetDisclosure
from dpda.service import signing
from dpda.service.config import Peer, SourceLimits
from dpda.source_party import reweighting as RW
from dpda.source_party import rpc_batches, rpc_pate
from dpda.source_party.context import SourceContext
from dpda.source_party.ledger_desk import LedgerDesk, SignedRelease
from dpda.source_party.peer_cpu import PeerCpuBudget
from dpda.source_party.releases import PreparedSession, SourceReleaser
from dpda.source_party.rpc_ledger import LedgerSync
from dpda.source_party.rpc_reweighting import Reweighting
from dpda.source_party.rpc_sessions import Sessions
from dpda.source_party.store import SourceStore
from dpda.source_party.workers import Workers
from dpda.terms import SessionTerms

__all__ = ["SignedRelease", "SourceHandlers"]


class SourceHandlers:
    """One method per RPC (the servicer's calls), over the composed parts. ``_plan`` and
    ``_release_one`` are the steps a test's subclass may replace to play a misbehaving
    source; the parts call them through this object."""

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
        self.ledger = ledger
        self.releasers = releasers
        self.key = signing_key
        self.peers = peers
        self.limits = limits or SourceLimits()
        self.lock = threading.RLock()  # one release at a time: the charge check must be atomic
        # the work a peer sizes (teachers, votes, hints): CPU seconds per peer and window
        lim = self.limits
        cpu = PeerCpuBudget(
            lim.peer_cpu_seconds,
            lim.peer_cpu_window_s,
            queue=lim.peer_work_queue,
            wait_s=lim.peer_cpu_window_s,
        )
        self.workers = Workers(self.limits, cpu)
        self.ctx = SourceContext(
            store=SourceStore(conn),
            desk=LedgerDesk(ledger, signing_key, peers, self.lock),
            releasers=releasers,
            peers=peers,
            limits=self.limits,
            cpu=cpu,
            workers=self.workers,
            max_batches=max_batches_per_request,
        )
        for name, r in releasers.items():  # a restarted source reads a session's statistics
            r.stored_statistics = functools.partial(self.ctx.store.statistics, name)
        self.reweighting = self.ctx.reweighting  # the public-source setting's open sessions
        self.sessions = Sessions(self.ctx, self._plan)
        self.reweights = Reweighting(self.ctx)
        self.sync = LedgerSync(self.ctx)

    # ------------------------------------------------------------------ replaceable steps
    def _plan(
        self,
        releaser: SourceReleaser,
        terms: SessionTerms,
        disclosure: TargetDisclosure,
        projection: np.ndarray | None = None,
    ) -> PreparedSession:
        """Policy checks and the release plan (``Workers.plan``)."""
        return self.workers.plan(releaser, terms, disclosure, projection)

    def _release_one(
        self, peer: str, releaser: SourceReleaser, session_id: str, index: int, call: set[str]
    ) -> SignedRelease:
        """One batch, replayed or charged (``rpc_batches.release_one``), under the lock."""
        return rpc_batches.release_one(self.ctx, peer, releaser, session_id, index, call)

    # -------------------------------------------------------------------------- sessions
    def describe(self, peer: str, dataset: str, planned_terms_json: str = "") -> dict[str, Any]:
        """``DescribeDataset`` (``Sessions.describe``)."""
        return self.sessions.describe(peer, dataset, planned_terms_json)

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
        return self.sessions.open_session(
            peer, terms_json, scaling, basis, session_id, target_sig, target_claim
        )

    def projection(self, peer: str, session_id: str) -> np.ndarray:
        return self.sessions.session(peer, session_id)[1].projection

    def close_session(self, peer: str, session_id: str) -> list[int]:
        """Close a release or reweighting session; returns the seqs of the peer's releases (of
        the session's dataset) that lack its countersignature, so the last one of a job is
        reconciled before the job ends."""
        pending = self.reweights.close(peer, session_id)
        if pending is not None:
            return pending
        return self.sessions.close_session(peer, session_id)

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
        return rpc_batches.release_batches(
            self.ctx, self.sessions, self._release_one, peer, session_id, start, count,
            ledger_head, ledger_length,
        )  # fmt: skip

    def query_teachers(
        self,
        peer: str,
        session_id: str,
        index: int,
        queries: np.ndarray,
        ledger_head: str,
        ledger_length: int = -1,
    ) -> tuple[PateAnswer, LedgerEntry, tuple[LedgerEntry, ...]]:
        return rpc_pate.query_teachers(
            self.ctx, self.sessions, peer, session_id, index, queries, ledger_head, ledger_length
        )

    # ---------------------------------------------------------- reweighting (public source)
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
        """``Reweighting.open``: checks and the plan; nothing charged."""
        return self.reweights.open(
            peer, terms_json, rows, labels, scaling, basis, scale, session_id, target_sig
        )

    def reweight_steps(
        self,
        peer: str,
        session_id: str,
        start: int,
        count: int,
        ledger_head: str,
        ledger_length: int = -1,
    ) -> tuple[np.ndarray, LedgerEntry, tuple[LedgerEntry, ...]]:
        """``Reweighting.steps``: replayed, or charged before the rows are read."""
        return self.reweights.steps(peer, session_id, start, count, ledger_head, ledger_length)

    # ------------------------------------------------------------------------ ledger sync
    def countersign(self, peer: str, dataset: str, seq: int, target_sig: str) -> None:
        self.sync.countersign(peer, dataset, seq, target_sig)

    def ledger_entries(
        self, peer: str, dataset: str, since: int
    ) -> tuple[list[str], int, str, list[int]]:
        return self.sync.ledger_entries(peer, dataset, since)

    def restore_ledger(self, peer: str, dataset: str, entries_json: list[str]) -> tuple[int, str]:
        return self.sync.restore_ledger(peer, dataset, entries_json)
