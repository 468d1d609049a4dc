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
families, each of which owns its RPCs' signatures (``rpc_sessions.Sessions``,
``rpc_batches.Batches``, ``rpc_pate.PateQueries``, ``rpc_reweighting.Reweighting``,
``rpc_ledger.LedgerSync``). The servicer calls the families directly.
"""

from __future__ import annotations

import functools
import sqlite3
import threading

from dpda.dp.ledger import PrivacyLedger
from dpda.service import signing
from dpda.service.config import Peer, SourceLimits
from dpda.source_party.context import SourceContext
from dpda.source_party.ledger_desk import LedgerDesk, SignedRelease
from dpda.source_party.peer_cpu import PeerCpuBudget
from dpda.source_party.releases import SourceReleaser
from dpda.source_party.rpc_batches import Batches
from dpda.source_party.rpc_ledger import LedgerSync
from dpda.source_party.rpc_pate import PateQueries
from dpda.source_party.rpc_reweighting import Reweighting
from dpda.source_party.rpc_sessions import Sessions
from dpda.source_party.store import SourceStore
from dpda.source_party.workers import Workers

__all__ = ["SignedRelease", "SourceHandlers"]


class SourceHandlers:
    """The source's parts, composed once: the context every part shares and one object per
    RPC family. A test's subclass plays a misbehaving source by naming its own subclass of a
    family (``sessions_class``, ``batches_class``, ``pate_class``)."""

    sessions_class: type[Sessions] = Sessions
    batches_class: type[Batches] = Batches
    pate_class: type[PateQueries] = PateQueries

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
        self.sessions = self.sessions_class(self.ctx)
        self.batches = self.batches_class(self.ctx, self.sessions)
        self.pate = self.pate_class(self.ctx, self.sessions)
        self.reweights = Reweighting(self.ctx)
        self.sync = LedgerSync(self.ctx)

    def close_session(self, peer: str, session_id: str) -> list[int]:
        """``CloseSession`` of a release or reweighting session; returns the seqs of the peer's
        releases (of the session's dataset) that lack its countersignature, so the last one of
        a job is reconciled before the job ends."""
        pending = self.reweights.close(peer, session_id)
        if pending is not None:
            return pending
        return self.sessions.close_session(peer, session_id)
