"""The public-source setting's RPCs, source side (``source_party.reweighting``): open a reweighting
session on this daemon's rows, and run blocks of its steps. A block goes through
``replay_or_charge`` like every other release, its draw outside the global lock (one block of
a session at a time)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import numpy as np

from dpda.data.preprocessing import Scaling
from dpda.dp.events import event_from_json
from dpda.dp.ledger import LedgerEntry
from dpda.errors import InvalidInput, PolicyRefused
from dpda.protocol import RequestId, payload_digest
from dpda.public_source_terms import ReweightingTerms
from dpda.source_party import reweight_quota
from dpda.source_party import reweighting as RW
from dpda.source_party.context import SourceContext
from dpda.source_party.replay import Charged, replay_or_charge


def _is_reweighting(request_id: str) -> bool:
    rid = RequestId.parse(request_id)
    return rid is not None and rid.kind == "reweight"


@dataclass
class ReweightKind:
    """Steps ``start … start+count−1`` of a reweighting session as a ``ReleaseKind``."""

    ctx: SourceContext
    peer: str
    rs: RW.ReweightingSession
    start: int
    count: int
    ledger_head: str
    ledger_length: int
    lost: str = "these steps were charged and their outputs are lost: they cannot be sent again"
    drawn: str = "source.reweight.charged"
    stored: str = "source.reweight.stored"
    draw_unlocked: bool = True  # the session's own lock keeps its blocks in order

    @property
    def request_id(self) -> RequestId:
        return RequestId.reweight(self.rs.session_id, self.start)

    def check_replay(self, entry: LedgerEntry) -> None:
        if entry.params.get("count") != self.count:
            raise InvalidInput("a replayed request id with altered content")

    def load(self, entry: LedgerEntry) -> np.ndarray | None:
        """The stored outputs; refused when they expired (``Reweighting.expire``): the block
        was charged and sent, and is neither drawn nor charged again."""
        store = self.ctx.store
        blob = store.outputs(self.rs.dataset, entry.seq)
        if blob is None:
            if store.outputs_expired(self.rs.dataset, entry.seq):
                raise PolicyRefused(
                    "these steps were charged and their outputs sent; the stored copy expired "
                    f"after limits.reweight_outputs_max_age_s "
                    f"({self.ctx.limits.reweight_outputs_max_age_s:g} s) and is not drawn or "
                    "charged again",
                    public=True,
                )
            return None
        if self.rs.terms.method == "noisy-md":
            return np.frombuffer(blob, "<f8").reshape(self.count, self.rs.opt.x.shape[0])
        return np.frombuffer(blob, "<i8")

    def redrawable(self, entry: LedgerEntry) -> bool:
        return bool(self.rs.opt.t == self.start)  # the session has not stepped past it

    def redraw(self, entry: LedgerEntry) -> Charged[np.ndarray]:
        return Charged(entry.seq, lambda: RW.draw(self.rs, self.count))

    def charge(self, entries: list[LedgerEntry]) -> Charged[np.ndarray]:
        """Charge a new block (under the lock): its outputs must fit the storage limits, and
        the dataset, peer and session caps hold."""
        self._check_room(entries)  # before any charge
        rs, ctx, ds = self.rs, self.ctx, self.rs.dataset
        if rs.opt.t != self.start:
            raise InvalidInput(f"start: the session has taken {rs.opt.t} steps", public=True)
        known = ctx.desk.known_prefix(ds, self.ledger_head, self.ledger_length)
        name = ctx.name(self.peer)
        ctx.desk.require_countersigned(ds, name, set())
        prior_peer = [event_from_json(e.dp_event) for e in entries if e.peer == name]
        prior_session = [event_from_json(e.dp_event) for e in entries if e.session == rs.session_id]
        entry = ctx.desk.ledger.charge(
            dataset=ds,
            events=[rs.plan.event(self.count)],
            session=rs.session_id,
            peer=name,
            request_id=str(self.request_id),
            privacy_unit="record",
            neighbouring="replace-one",
            params={
                "kind": "reweighting",
                "method": rs.terms.method,
                "start": self.start,
                "count": self.count,
                "step_parameter": rs.plan.step_parameter,
                "sensitivity": rs.sensitivity,
                "rows_sha256": rs.rows_sha256,
                "delta": ctx.desk.ledger.budgets[ds].delta,
                **({"insecure_seed": True} if ctx.releasers[ds].insecure_seed else {}),
            },
            extra_caps=[
                ("session", rs.terms.epsilon, prior_session),
                ("peer", ctx.peers[self.peer].epsilon_cap, prior_peer),
            ],
        )
        return Charged(entry.seq, lambda: RW.draw(rs, self.count), known)

    def _check_room(self, entries: list[LedgerEntry]) -> None:
        """The block's outputs must fit the session's and the peer's storage (under the lock)."""
        rs, ctx = self.rs, self.ctx
        name = ctx.name(self.peer)
        mine = [e for e in entries if e.peer == name and _is_reweighting(e.request_id)]
        session = [e.seq for e in mine if e.session == rs.session_id]
        new = self.count * reweight_quota.step_bytes(rs.terms.method, int(rs.opt.q.size))
        conn = ctx.store.conn
        reweight_quota.check(
            new,
            reweight_quota.stored_bytes(conn, rs.dataset, session),
            reweight_quota.stored_bytes(conn, rs.dataset, [e.seq for e in mine]),
            ctx.limits.reweight_bytes_per_session,
            ctx.limits.reweight_bytes_per_peer,
        )

    def store(self, seq: int, payload: np.ndarray) -> None:
        blob = np.ascontiguousarray(payload).tobytes()
        ds = self.rs.dataset
        self.ctx.store.put_outputs(ds, seq, str(self.request_id), blob, self.ctx.clock())
        self.ctx.desk.ledger.store.update_signatures(ds, seq, payload_digest(blob), "", "")


class Reweighting:
    """The reweighting sessions of the peers (in memory, in ``ctx.reweighting``)."""

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx

    def open(
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
        ctx = self.ctx
        _, terms = ctx.signed_terms(peer, terms_json, target_sig, ReweightingTerms)
        releaser = ctx.releaser(terms.dataset)
        existing = ctx.reweighting.get(session_id) if session_id else None
        if session_id and (existing is None or existing.peer != peer):
            raise InvalidInput("unknown or closed session")
        if existing is not None:
            if existing.terms != terms or existing.rows_sha256 != RW.rows_digest(rows, labels):
                raise InvalidInput("a resumed session must keep its terms and rows")
            rs = existing
        else:
            with ctx.lock:
                self._limit(peer)
            with ctx.workers.planning_slot(peer):
                rs = RW.prepare(
                    releaser, uuid.uuid4().hex, peer, terms, rows, labels, scaling, basis, scale
                )
            with ctx.lock:
                self._limit(peer)  # again: another open may have won meanwhile
                ctx.reweighting[rs.session_id] = rs
        plan_json = rs.plan.model_dump_json()
        return rs, plan_json, ctx.sign_plan(terms.model_dump_json(), plan_json)

    def expire(self) -> int:
        """Delete the stored outputs older than ``limits.reweight_outputs_max_age_s``, which
        frees their share of the storage limits (under the lock); how many blocks."""
        now = self.ctx.clock()
        return self.ctx.store.expire_outputs(now - self.ctx.limits.reweight_outputs_max_age_s, now)

    def _limit(self, peer: str) -> None:
        """Expire idle reweighting sessions and old outputs, then refuse past
        ``sessions_per_peer`` (under the lock)."""
        ctx = self.ctx
        self.expire()
        now = time.monotonic()
        for sid, s in list(ctx.reweighting.items()):
            if now - s.last_used > ctx.limits.session_idle_s:
                ctx.reweighting.pop(sid, None)
        mine = sum(1 for s in ctx.reweighting.values() if s.peer == peer)
        if mine >= ctx.limits.sessions_per_peer:
            raise PolicyRefused(f"this peer has {mine} open reweighting sessions, the limit")

    def steps(
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
        ctx = self.ctx
        rs = ctx.reweighting.get(session_id)
        if rs is None or rs.peer != peer:
            raise InvalidInput("unknown or closed session")
        releaser = ctx.releasers[rs.dataset]
        RW.check_block(rs, releaser.policy.max_reweighting_work, start, count)
        with rs.lock:  # one block of a session at a time; the draw holds no global lock
            rs.last_used = time.monotonic()
            with ctx.lock:
                self.expire()
            kind = ReweightKind(ctx, peer, rs, start, count, ledger_head, ledger_length)
            out = replay_or_charge(ctx.desk, rs.dataset, kind)
            return out.payload, out.entry, out.catch_up

    def close(self, peer: str, session_id: str) -> list[int] | None:
        """Close the peer's reweighting session ``session_id``: the seqs of its releases that
        lack its countersignature, or None when it holds no such session."""
        ctx = self.ctx
        rs = ctx.reweighting.get(session_id)
        if rs is None or rs.peer != peer:
            return None
        with ctx.lock:
            ctx.reweighting.pop(session_id, None)
            return ctx.desk.uncountersigned(rs.dataset, ctx.name(peer))
