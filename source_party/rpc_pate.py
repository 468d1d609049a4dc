"""``QueryTeachers``, source side: the teachers' noisy votes on the peer's queries (PATE). The
teachers and their votes are computed outside the lock, under the peer's CPU budget; the
answer then goes through ``replay_or_charge`` like every other release."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dpda.dp.ledger import LedgerEntry
from dpda.errors import InvalidInput
from dpda.protocol import PateAnswer, RequestId, queries_digest
from dpda.source_party.context import SourceContext
from dpda.source_party.releases import SourceReleaser
from dpda.source_party.replay import Charged, replay_or_charge
from dpda.source_party.rpc_sessions import Sessions


@dataclass
class PateKind:
    """The answer to query ``index`` of a session as a ``ReleaseKind``."""

    ctx: SourceContext
    peer: str
    releaser: SourceReleaser
    session_id: str
    index: int
    queries: np.ndarray
    votes: np.ndarray
    ledger_head: str
    ledger_length: int
    lost: str = "this answer was sent before and its stored copy is lost: it cannot be sent again"
    drawn: str = "source.pate.drawn"
    stored: str = "source.pate.stored"
    draw_unlocked: bool = False

    @property
    def request_id(self) -> RequestId:
        return RequestId.pate(self.session_id, self.index)

    def check_replay(self, entry: LedgerEntry) -> None:
        if entry.params.get("queries_sha256") != queries_digest(self.queries):
            raise InvalidInput("a replayed request id with altered content")

    def load(self, entry: LedgerEntry) -> PateAnswer | None:
        labels = self.ctx.store.answer(self.releaser.dataset, entry.seq)
        return None if labels is None else PateAnswer(np.frombuffer(labels, "<i8"), entry.seq)

    def redrawable(self, entry: LedgerEntry) -> bool:
        return True

    def redraw(self, entry: LedgerEntry) -> Charged[PateAnswer]:
        sid, queries, votes = self.session_id, self.queries, self.votes
        return Charged(
            entry.seq, lambda: self.releaser.pate.draw_answer(sid, queries, entry, votes)
        )

    def charge(self, entries: list[LedgerEntry]) -> Charged[PateAnswer]:
        desk, ds = self.ctx.desk, self.releaser.dataset
        known = desk.known_prefix(ds, self.ledger_head, self.ledger_length)
        name = self.ctx.name(self.peer)
        desk.require_countersigned(ds, name, set())
        ans = self.releaser.pate.answer(
            self.session_id,
            self.index,
            self.queries,
            peer=name,
            extra_caps=[desk.peer_cap(self.peer, ds)],
            votes=self.votes,
        )
        return Charged(ans.ledger_seq, lambda: ans, known)

    def store(self, seq: int, payload: PateAnswer) -> None:
        rid = str(self.request_id)
        self.ctx.store.put_answer(self.releaser.dataset, seq, rid, payload.payload_bytes())


class PateQueries:
    """``QueryTeachers``: the teachers' noisy votes on a peer's queries."""

    def __init__(self, ctx: SourceContext, sessions: Sessions) -> None:
        self.ctx = ctx
        self.sessions = sessions

    def query_teachers(
        self,
        peer: str,
        session_id: str,
        index: int,
        queries: np.ndarray,
        ledger_head: str,
        ledger_length: int = -1,
    ) -> tuple[PateAnswer, LedgerEntry, tuple[LedgerEntry, ...]]:
        ctx = self.ctx
        if index < 0:
            raise InvalidInput("query index out of bounds")
        releaser, _ = self.sessions.session(peer, session_id)
        releaser.pate.check_queries(session_id, queries)
        with ctx.cpu.spend(peer):  # refused before any work once the peer's budget is used
            releaser.pate.prepare_teachers(session_id, peer)  # training outside the lock
            # the votes too: their cost grows with the peer's queries and teachers (100,000
            # queries to 600 teachers held the lock about 6 s); only the charge, the noise
            # and the store need it
            votes = releaser.pate.votes(session_id, queries)
        kind = PateKind(
            ctx, peer, releaser, session_id, index, queries, votes, ledger_head, ledger_length
        )
        out = replay_or_charge(ctx.desk, releaser.dataset, kind)
        return out.payload, out.entry, out.catch_up
