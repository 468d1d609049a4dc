"""``ReleaseBatches``, source side: for each batch of the requested range,

1. the peer owns the session (``Sessions.session``);
2. the target's ledger head must be ours, or a prefix of ours (else FAILED_PRECONDITION: sync);
3. the batch goes through ``replay_or_charge`` (a retry gets the stored payload back; a new
   batch is charged, drawn, stored and signed), with the entries the peer lacks sent along.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from dpda.dp.ledger import LedgerEntry
from dpda.errors import InvalidInput
from dpda.protocol import BatchRelease, RequestId
from dpda.service.crashpoints import crash_point
from dpda.source_party.context import SourceContext
from dpda.source_party.ledger_desk import SignedRelease
from dpda.source_party.releases import SourceReleaser
from dpda.source_party.replay import Charged, replay_or_charge
from dpda.source_party.rpc_sessions import Sessions


@dataclass
class BatchKind:
    """Batch ``index`` of a session as a ``ReleaseKind``."""

    ctx: SourceContext
    peer: str
    releaser: SourceReleaser
    session_id: str
    index: int
    call: set[str]  # the request ids of the current call (not yet countersigned, rightly)
    lost: str = (
        "this release was sent before and its stored copy is lost: it cannot be sent again "
        "(a second draw would be a second release)"
    )
    drawn: str = "source.release.drawn"
    stored: str = "source.release.stored"
    draw_unlocked: bool = False

    @property
    def request_id(self) -> RequestId:
        return RequestId.batch(self.session_id, self.index)

    def check_replay(self, entry: LedgerEntry) -> None:
        return None  # a batch's request id names its content

    def load(self, entry: LedgerEntry) -> BatchRelease | None:
        found = self.ctx.store.batch(self.releaser.dataset, entry.seq)
        if found is None:
            return None
        terms, info = self.releaser.session(self.session_id)
        spec = info.plan.release_spec(terms, self.index)
        st = self.ctx.store.statistics(self.releaser.dataset, entry.seq)
        stats = None if st is None else (st.loc, st.scale, st.clip_norm)
        return BatchRelease(self.index, found[0], found[1], spec, entry.seq, stats)

    def redrawable(self, entry: LedgerEntry) -> bool:
        return True

    def redraw(self, entry: LedgerEntry) -> Charged[BatchRelease]:
        # the entry is durable, its payload never stored: it never left; drawn now, uncharged
        return Charged(entry.seq, lambda: self._draw(entry))

    def charge(self, entries: list[LedgerEntry]) -> Charged[BatchRelease]:
        ds = self.releaser.dataset
        name = self.ctx.name(self.peer)
        self.ctx.desk.require_countersigned(ds, name, self.call)
        caps = [self.ctx.desk.peer_cap(self.peer, ds)]
        entry = self.releaser.charge(self.session_id, self.index, peer=name, extra_caps=caps)
        if self.draw_unlocked:  # drawn by ``replay_or_charge`` once the lock is released
            return Charged(entry.seq, lambda: self._draw(entry))
        rel = self._draw(entry)  # under the lock, with the charge
        return Charged(entry.seq, lambda: rel)

    def _draw(self, entry: LedgerEntry) -> BatchRelease:
        # drawn outside the lock, the payload's hash goes into the entry with the store
        if self.draw_unlocked:
            return self.releaser.draw_payload(self.session_id, self.index, entry)
        return self.releaser.draw(self.session_id, self.index, entry)

    def store(self, seq: int, payload: BatchRelease) -> None:
        if self.draw_unlocked:
            self.releaser.record_payload(seq, payload)
        rid = str(self.request_id)
        self.ctx.store.put_batch(self.releaser.dataset, payload, rid)


class Batches:
    """``ReleaseBatches``: ``release_one`` is the step a test's subclass may replace to play a
    misbehaving source."""

    def __init__(self, ctx: SourceContext, sessions: Sessions) -> None:
        self.ctx = ctx
        self.sessions = sessions

    def release_one(
        self, peer: str, releaser: SourceReleaser, session_id: str, index: int, call: set[str]
    ) -> SignedRelease:
        """One batch, replayed or charged (under the lock); the learned cost and synthetic
        points are charged under it and trained outside it (``SourceReleaser.draws_unlocked``;
        ``release_batches`` holds the session's own lock)."""
        unlocked = releaser.draws_unlocked(session_id, index)
        kind = BatchKind(self.ctx, peer, releaser, session_id, index, call, draw_unlocked=unlocked)
        out = replay_or_charge(self.ctx.desk, releaser.dataset, kind)
        return SignedRelease(out.payload, out.entry)

    def release_batches(
        self,
        peer: str,
        session_id: str,
        start: int,
        count: int,
        ledger_head: str,
        ledger_length: int = -1,
    ) -> Iterator[SignedRelease]:
        """Batches ``start … start+count−1``, each signed and sent as soon as it is stored."""
        ctx, sessions = self.ctx, self.sessions
        if count < 1 or count > ctx.max_batches or start < 0:
            raise InvalidInput("batch range out of bounds")
        releaser, info = sessions.session(peer, session_id)
        if start + count > info.plan.releases:
            raise InvalidInput("batch range out of bounds")
        ctx.workers.await_warm(session_id)  # outside the lock: its work is not done twice
        with ctx.lock:
            known = ctx.desk.known_prefix(releaser.dataset, ledger_head, ledger_length)
        call = {str(RequestId.batch(session_id, i)) for i in range(start, start + count)}
        for index in range(start, start + count):
            if releaser.draws_unlocked(session_id, index):
                # the learned cost and synthetic points train for seconds, sized by the peer's
                # terms: charged and stored under the lock, trained outside it, one draw of
                # the session at a time and under the peer's CPU budget
                with ctx.serial(session_id), ctx.cpu.spend(peer):
                    signed = self.release_one(peer, releaser, session_id, index, call)
                with ctx.lock:
                    signed, known = ctx.desk.with_catch_up(releaser.dataset, signed, known)
                    crash_point("source.release.signed")
            else:
                with ctx.lock:  # charge, draw and store atomically; send outside the lock
                    signed = self.release_one(peer, releaser, session_id, index, call)
                    signed, known = ctx.desk.with_catch_up(releaser.dataset, signed, known)
                    crash_point("source.release.signed")
            yield signed
        # the last one is on its way (gRPC asks for more once it has sent it): the session's
        # next release is composed while the target fits this one
        sessions.warm(peer, releaser, session_id, start + count)
