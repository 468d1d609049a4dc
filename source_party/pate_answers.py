"""The PATE family of a releaser's sessions: the teachers (trained on the session's features on
first use, and shared through a bounded cache with every session that would train the same
ones), the checks on a peer's queries, and the noisy arg-max of the teachers' votes,
charged before any noise is drawn."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from dpda.dp.events import event_from_json
from dpda.dp.ledger import LedgerEntry
from dpda.dp.pate import answers_event, noisy_argmax
from dpda.errors import BudgetExceeded, InvalidInput
from dpda.protocol import PateAnswer, RequestId, array_digest, queries_digest
from dpda.source_party.teachers import TeacherCache, TeacherEnsemble, teacher_assignment

if TYPE_CHECKING:
    from dpda.source_party.releases import SourceReleaser

# each peer's cache of trained teachers: 4 ensembles, at most 64 MiB (50 teachers of 31 classes
# over 800 raw features hold ~10 MiB); the daemon pins a few peers, so the whole is bounded
# the largest magnitude a query's value may have: a row of any session's space lies far
# inside it, and a linear teacher's scores on it stay finite
QUERY_LIMIT = 1e12
PEER_TEACHER_ENTRIES = 4
PEER_TEACHER_BYTES = 64 << 20


class PateAnswers:
    """PATE on one releaser's sessions (``SourceReleaser.pate``): it reads the releaser's
    sessions, features, ledger and noise streams, and holds the teachers' caches."""

    def __init__(self, releaser: SourceReleaser) -> None:
        self.releaser = releaser
        # one bounded cache per peer: a peer's answers come as fast from teachers another peer
        # had trained as from none, so no peer learns another's scaling or basis by timing
        self._teacher_caches: dict[str, TeacherCache] = {}
        self._pate_owner: dict[str, str] = {}  # session → the peer whose cache serves it
        self._partition_key: bytes | None = None
        self._partition_lock = threading.Lock()

    def teacher_cache(self, peer: str = "in-process") -> TeacherCache:
        """``peer``'s own cache of trained teachers (made empty at its first use)."""
        with self._partition_lock:
            cache = self._teacher_caches.get(peer)
            if cache is None:
                cache = self._teacher_caches[peer] = TeacherCache(
                    PEER_TEACHER_ENTRIES, PEER_TEACHER_BYTES
                )
            return cache

    def close(self, session_id: str) -> None:
        self._pate_owner.pop(session_id, None)

    def _teachers(self, session_id: str, peer: str | None = None) -> TeacherEnsemble:
        """The session's teachers: those of an earlier session of the same peer with the same
        feature map and teacher count (that peer's ``teacher_cache``), or trained now. The
        first caller binds the session to its peer (the daemon passes the caller's identity;
        in-process callers share ``"in-process"``). The daemon calls this before it takes its
        lock (``prepare_teachers``): training can take seconds and must not hold up other
        sessions' releases; sessions that need other teachers train concurrently. Nothing is
        held per session: memory is each peer's cache bound, however many sessions are open,
        and an evicted ensemble is trained again (deterministically: the same teachers)."""
        terms, info = self.releaser.session(session_id)
        owner = self._pate_owner.setdefault(session_id, peer or "in-process")
        projected = terms.pate_space == "projected"
        scaling = self.releaser.live(session_id).scaling
        key = (
            terms.pate_space,
            terms.pate_teachers,
            info.n_classes,
            "" if scaling is None else array_digest(scaling.mean) + array_digest(scaling.std),
            array_digest(info.projection) if projected else "",
        )
        parts_key = self._partition(session_id)

        def train() -> TeacherEnsemble:
            x = self.releaser.features(session_id)
            feats = x @ info.projection if projected else x
            parts = teacher_assignment(feats.shape[0], terms.pate_teachers, parts_key)
            return TeacherEnsemble(
                feats, self.releaser.domain.labels(), parts, terms.pate_teachers, info.n_classes
            )

        return self.teacher_cache(owner).get(key, train)

    def prepare_teachers(self, session_id: str, peer: str | None = None) -> TeacherEnsemble:
        """``_teachers``, called by the daemon with the calling peer before its lock."""
        return self._teachers(session_id, peer)

    def _partition(self, session_id: str) -> bytes:
        """The releaser's partition key (``teacher_assignment``), drawn once, at the first
        teachers, from that session's noise stream: a CSPRNG in the daemon, independent of the
        data; reproducible under an insecure testing seed (so service = simulate)."""
        with self._partition_lock:
            if self._partition_key is None:
                self._partition_key = self.releaser.live(session_id).noise.bytes(32)
            return self._partition_key

    def check_queries(self, session_id: str, queries: np.ndarray) -> None:
        terms, info = self.releaser.session(session_id)
        if info.plan.pate_scale is None:
            raise InvalidInput("PATE is not part of this session's terms")
        if terms.pate_space == "raw" and not self.releaser.allow_raw_queries:
            raise InvalidInput("this source does not accept raw-space queries")
        dim = info.projection.shape[1] if terms.pate_space == "projected" else info.n_features
        if queries.ndim != 2 or queries.shape[1] != dim or queries.shape[0] < 1:
            raise InvalidInput("queries have the wrong shape")
        if not np.all(np.isfinite(queries)):
            raise InvalidInput("queries have non-finite values")
        if np.any(np.abs(queries) > QUERY_LIMIT):
            raise InvalidInput(
                f"queries have values beyond ±{QUERY_LIMIT:g}: no row of the session's space "
                "lies there (the teachers' scores would overflow)"
            )
        if queries.shape[0] > info.plan.pate_queries:
            raise InvalidInput("more queries than the session's terms allow")

    def answer(
        self,
        session_id: str,
        index: int,
        queries: np.ndarray,
        peer: str = "in-process",
        extra_caps: Sequence[tuple[str, float, Sequence[Any]]] = (),
        votes: np.ndarray | None = None,
    ) -> PateAnswer:
        """Answer a batch of PATE queries: charge first, then the noisy arg-max of the votes.
        ``votes``: the teachers' votes on ``queries`` (``votes``), counted before the caller
        took its lock; counted here when None."""
        self.check_queries(session_id, queries)
        terms, info = self.releaser.session(session_id)
        mine = [
            e
            for e in self.releaser.ledger.store.entries(self.releaser.dataset)
            if e.session == session_id
        ]
        asked = sum(int(e.params.get("n_queries", 0)) for e in mine)
        if asked + queries.shape[0] > info.plan.pate_queries:
            raise BudgetExceeded("the session's PATE queries are used up")
        scale = float(info.plan.pate_scale)  # type: ignore[arg-type]
        event = answers_event(terms.pate_aggregator, scale, queries.shape[0])
        prior = [event_from_json(e.dp_event) for e in mine]
        entry = self.releaser.ledger.charge(
            dataset=self.releaser.dataset,
            events=[event],
            session=session_id,
            peer=peer,
            request_id=str(RequestId.pate(session_id, index)),
            privacy_unit="record",
            neighbouring=terms.neighbouring,
            params={
                "kind": "pate",
                "aggregator": terms.pate_aggregator,
                "scale": scale,
                "n_queries": int(queries.shape[0]),
                "teachers": terms.pate_teachers,
                "delta": self.releaser.ledger.budgets[self.releaser.dataset].delta,
                "queries_sha256": queries_digest(queries),
                **({"insecure_seed": True} if self.releaser.insecure_seed else {}),
            },
            extra_caps=[("session", terms.epsilon, prior), *extra_caps],
        )
        return self.draw_answer(session_id, queries, entry, votes)

    def votes(self, session_id: str, queries: np.ndarray) -> np.ndarray:
        """The teachers' vote counts on ``queries``: deterministic, no noise and no charge, so
        they are counted outside any lock (the work a peer sizes by its number of queries)."""
        return self._teachers(session_id).votes(queries)

    def draw_answer(
        self,
        session_id: str,
        queries: np.ndarray,
        entry: LedgerEntry,
        votes: np.ndarray | None = None,
    ) -> PateAnswer:
        """Votes (unless counted before) and noise for an entry already durably in the ledger."""
        terms, info = self.releaser.session(session_id)
        if votes is None:
            votes = self._teachers(session_id).votes(queries)
        scale = float(entry.params["scale"])
        labels = noisy_argmax(
            votes, terms.pate_aggregator, scale, self.releaser.live(session_id).noise
        )
        ans = PateAnswer(labels, entry.seq)
        self.releaser.ledger.store.update_signatures(
            self.releaser.dataset, entry.seq, ans.sha256(), "", ""
        )
        return ans
