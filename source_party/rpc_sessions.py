"""The session RPCs of the source daemon: ``DescribeDataset`` (the public facts, and planning
the announced terms ahead), ``OpenSession``, the session's projection, and ``CloseSession``.
Sessions are stored (``store``) and rebuilt from their stored terms after a restart."""

from __future__ import annotations

import logging
import math
import time
import uuid
from typing import Any

import numpy as np
from pydantic import ValidationError

from dpda.data.preprocessing import Scaling
from dpda.dp.events import event_from_json
from dpda.dp.ledger import LedgerEntry, spend_of
from dpda.errors import InvalidInput, PeerMisbehaved, PolicyRefused, TermsInvalid
from dpda.protocol import SessionInfo, TargetDisclosure, payload_digest
from dpda.service import signing
from dpda.service.crashpoints import crash_point
from dpda.source_party.context import SourceContext
from dpda.source_party.releases import PreparedSession, SourceReleaser
from dpda.terms import SessionTerms, terms_error


def check_target_claim(
    pub: Any, claim: str, scaling: Scaling | None, basis: np.ndarray | None, terms: SessionTerms
) -> None:
    """The target's own ledger entry for the scaling and basis it sends under its own DP:
    signed by the target, over exactly these arrays, and charging what its events recompute
    to. The source's guarantee does not rest on it (the target's privacy is the target's);
    checking it lets the source's log say what the target spent, truthfully."""
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


class Sessions:
    """Release sessions: ``DescribeDataset``, ``OpenSession``, ``GetProjection`` and the
    release half of ``CloseSession``. ``plan`` is the planning step a test's subclass may
    replace to play a misbehaving source."""

    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx

    def plan(
        self,
        releaser: SourceReleaser,
        terms: SessionTerms,
        disclosure: TargetDisclosure,
        projection: np.ndarray | None = None,
    ) -> PreparedSession:
        """Policy checks and the release plan of ``terms`` (``Workers.plan``)."""
        return self.ctx.workers.plan(releaser, terms, disclosure, projection)

    def describe(self, peer: str, dataset: str, planned_terms_json: str = "") -> dict[str, Any]:
        """The public facts of a dataset for a pinned peer (``DescribeDataset``): its shape, the
        policy, δ, and the budget numbers against both caps that bind this peer. With
        ``planned_terms_json`` (the terms the peer means to open a session under), their plan
        and first charge are composed ahead in the background (``Workers.warm_plan``)."""
        ctx = self.ctx
        releaser = ctx.releaser(dataset)
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
        with ctx.lock:
            entries = ctx.desk.entries(dataset)
        budget = ctx.desk.ledger.budgets[dataset]
        name = ctx.name(peer)
        spent = spend_of([event_from_json(e.dp_event) for e in entries], budget.delta)
        mine = [event_from_json(e.dp_event) for e in entries if e.peer == name]
        peer_spent = spend_of(mine, budget.delta)
        cap = ctx.peers[peer].epsilon_cap
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
            with ctx.lock:
                full = ctx.store.count_open(peer) >= ctx.limits.sessions_per_peer
            if not full:  # a peer at its session limit could not open the session
                ctx.workers.warm_plan(
                    peer, name, releaser, planned, lambda: ctx.desk.peer_cap(peer, dataset)
                )
        return facts

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
        ctx = self.ctx
        pub, terms = ctx.signed_terms(peer, terms_json, target_sig, SessionTerms)
        if target_claim:
            check_target_claim(pub, target_claim, scaling, basis, terms)
        releaser = ctx.releaser(terms.dataset)
        if session_id:
            releaser, info = self.session(peer, session_id)
            stored = releaser.session(info.session_id)[0]
            if stored != terms:
                raise InvalidInput("a resumed session must keep its terms")
        else:
            with ctx.lock:
                self._expire_idle()
                self._check_limit(peer)
            with ctx.workers.planning_slot(peer):  # the peer's share, its CPU counted
                prepared = self.plan(releaser, terms, TargetDisclosure(scaling, basis), None)
            with ctx.lock:
                self._check_limit(peer)  # checked again: another open may have won
                sid = uuid.uuid4().hex
                info = releaser.install(prepared, sid)
                ctx.store.add_session(peer, terms, info, scaling)
                crash_point("source.open_session.stored")
                ctx.last_used[sid] = time.monotonic()
            self.warm(peer, releaser, sid)
        plan_json = info.plan.model_dump_json()
        return info, plan_json, ctx.sign_plan(terms.model_dump_json(), plan_json)

    def projection(self, peer: str, session_id: str) -> np.ndarray:
        """The session's projection (``GetProjection``)."""
        return self.session(peer, session_id)[1].projection

    def warm(self, peer: str, releaser: SourceReleaser, sid: str, index: int = 0) -> None:
        """Compose the charge of the session's release ``index`` ahead (``Workers.warm``)."""
        desk = self.ctx.desk
        self.ctx.workers.warm(sid, releaser, lambda: desk.peer_cap(peer, releaser.dataset), index)

    def _check_limit(self, peer: str) -> None:
        cap = self.ctx.limits.sessions_per_peer
        if self.ctx.store.count_open(peer) >= cap:
            raise PolicyRefused(f"this peer has {cap} open sessions, the limit: close one first")

    def _expire_idle(self) -> None:
        """Close sessions unused for ``session_idle_s`` (sessions restored after a restart
        count from the restart)."""
        ctx = self.ctx
        now = time.monotonic()
        for sid, ds in ctx.store.open_sessions():
            last = ctx.last_used.setdefault(sid, now)
            if now - last > ctx.limits.session_idle_s:
                ctx.store.close_session(sid)
                ctx.releasers[ds].close_session(sid)
                ctx.last_used.pop(sid, None)
                ctx.workers.forget(sid)

    def session(self, peer: str, session_id: str) -> tuple[SourceReleaser, SessionInfo]:
        """The peer's open session; one that is not in memory (after a restart) is rebuilt from
        its stored terms, projection and disclosure — planned outside the lock."""
        ctx = self.ctx
        with ctx.lock:
            owner = ctx.store.session_owner(session_id)
            if owner is None or owner[0] != peer or owner[2]:
                raise InvalidInput("unknown or closed session")
            releaser = ctx.releasers[owner[1]]
            ctx.last_used[session_id] = time.monotonic()
            if releaser.resident(session_id):
                return releaser, releaser.session(session_id)[1]
            stored = ctx.store.session(session_id)
        assert stored is not None  # sessions are never deleted, only closed
        disclosure = TargetDisclosure(stored.scaling, None)
        with ctx.workers.planning_slot(peer):
            prepared = self.plan(releaser, stored.terms, disclosure, stored.projection)
        with ctx.lock:
            if not releaser.resident(session_id):
                releaser.install(prepared, session_id)
            return releaser, releaser.session(session_id)[1]

    def close_session(self, peer: str, session_id: str) -> list[int]:
        """Close; returns the seqs of the peer's releases (of the session's dataset) that lack
        its countersignature, so the last one of a job is reconciled before the job ends."""
        ctx = self.ctx
        releaser, _ = self.session(peer, session_id)
        with ctx.lock:
            ctx.store.close_session(session_id)
            releaser.close_session(session_id)
            ctx.last_used.pop(session_id, None)
            ctx.workers.forget(session_id)
            return ctx.desk.uncountersigned(releaser.dataset, ctx.name(peer))
