"""What every RPC family of the source daemon shares: its tables, its side of the ledger, its
releasers, peers and limits, the background workers, and the sessions in use."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pydantic import ValidationError

from dpda.errors import InvalidInput, PeerMisbehaved, TermsInvalid
from dpda.public_source_terms import ReweightingTerms
from dpda.service import signing
from dpda.service.config import Peer, SourceLimits
from dpda.source_party import reweighting as RW
from dpda.source_party.ledger_desk import LedgerDesk
from dpda.source_party.peer_cpu import PeerCpuBudget
from dpda.source_party.releases import SourceReleaser
from dpda.source_party.store import SourceStore
from dpda.source_party.workers import Workers
from dpda.terms import SessionTerms, terms_error

T = TypeVar("T", SessionTerms, ReweightingTerms)


@dataclass
class SourceContext:
    store: SourceStore
    desk: LedgerDesk
    releasers: dict[str, SourceReleaser]
    peers: dict[str, Peer]
    limits: SourceLimits
    cpu: PeerCpuBudget
    workers: Workers
    max_batches: int
    last_used: dict[str, float] = field(default_factory=dict)  # session → its last use
    # wall-clock seconds: when stored outputs were stored, and their age (tests inject one)
    clock: Callable[[], float] = time.time
    # public-source sessions: in memory; after a restart the peer opens a new one (the
    # charges already made stay in the ledger and keep counting)
    reweighting: dict[str, RW.ReweightingSession] = field(default_factory=dict)
    # one draw at a time per session, for the draws made outside ``lock`` (the learned cost)
    _serial: dict[str, threading.Lock] = field(default_factory=dict)
    _serial_guard: threading.Lock = field(default_factory=threading.Lock)

    def serial(self, session_id: str) -> threading.Lock:
        """The session's own lock: a draw made outside ``lock`` holds it, so a repeated
        request of the same session waits for the first draw instead of drawing again."""
        with self._serial_guard:
            return self._serial.setdefault(session_id, threading.Lock())

    @property
    def lock(self) -> threading.RLock:
        """The one lock a charge check holds (``LedgerDesk.lock``)."""
        return self.desk.lock

    def releaser(self, dataset: str) -> SourceReleaser:
        releaser = self.releasers.get(dataset)
        if releaser is None:
            raise InvalidInput("unknown dataset", public=True)
        return releaser

    def name(self, peer: str) -> str:
        """The configured name of the peer with this certificate fingerprint."""
        return self.peers[peer].name

    def signed_terms(
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

    def sign_plan(self, terms_json: str, plan_json: str) -> str:
        """The source's signature over the terms and the plan it answers them with."""
        return signing.sign(self.desk.key, (terms_json + plan_json).encode())
