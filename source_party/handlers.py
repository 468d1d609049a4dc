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

import json
import sqlite3
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
from pydantic import ValidationError

from common import signing
from common.config import Peer
from common.data.preprocessing import Scaling
from common.dp.events import event_from_json
from common.dp.ledger import LedgerEntry, PrivacyLedger, head_hash
from common.errors import InvalidInput, LedgerCorrupt, PeerMisbehaved, TermsInvalid
from common.terms import SessionTerms, terms_error

from .releases import (
    BatchRelease,
    PateAnswer,
    SessionInfo,
    SourceReleaser,
    TargetDisclosure,
    queries_digest,
)

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
CREATE TABLE IF NOT EXISTS payloads (
    dataset TEXT NOT NULL, seq INTEGER NOT NULL, request_id TEXT NOT NULL UNIQUE,
    z BLOB NOT NULL, z_rows INTEGER NOT NULL, counts BLOB NOT NULL,
    PRIMARY KEY (dataset, seq)
);
"""


@dataclass(frozen=True)
class SignedRelease:
    release: BatchRelease
    entry: LedgerEntry  # signed: entry.source_sig

    @property
    def source_sig(self) -> str:
        return self.entry.source_sig


class SourceHandlers:
    def __init__(
        self,
        conn: sqlite3.Connection,
        ledger: PrivacyLedger,
        releasers: dict[str, SourceReleaser],
        signing_key: signing.Ed25519PrivateKey,
        peers: dict[str, Peer],
        max_batches_per_request: int = 1000,
    ) -> None:
        self.conn = conn
        self.conn.executescript(_SCHEMA)
        self.ledger = ledger
        self.releasers = releasers
        self.key = signing_key
        self.peers = peers
        self.max_batches = max_batches_per_request
        self.lock = threading.RLock()  # one release at a time: the charge check must be atomic

    # -------------------------------------------------------------------------- sessions
    def open_session(
        self,
        peer: str,
        terms_json: str,
        scaling: Scaling | None,
        basis: np.ndarray | None,
        session_id: str = "",
    ) -> tuple[SessionInfo, str, str]:
        try:
            terms = SessionTerms.model_validate_json(terms_json)
        except ValidationError as exc:
            raise TermsInvalid(terms_error(exc)) from None
        releaser = self.releasers.get(terms.dataset)
        if releaser is None:
            raise InvalidInput("unknown dataset")
        with self.lock:
            if session_id:
                info = self._load_session(peer, session_id)
                stored = releaser.session(info.session_id)[0]
                if stored != terms:
                    raise InvalidInput("a resumed session must keep its terms")
            else:
                sid = uuid.uuid4().hex
                info = releaser.open_session(terms, TargetDisclosure(scaling, basis), sid)
                self._store_session(peer, terms, info, scaling)
        plan_json = info.plan.model_dump_json()
        sig = signing.sign(self.key, (terms.model_dump_json() + plan_json).encode())
        return info, plan_json, sig

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

    def _load_session(self, peer: str, session_id: str) -> SessionInfo:
        row = self.conn.execute(
            "SELECT peer, dataset, terms_json, projection, proj_shape, scaling_mean, scaling_std,"
            " closed FROM sessions WHERE session_id=?",
            (session_id,),
        ).fetchone()
        if row is None or row[0] != peer or row[7]:
            raise InvalidInput("unknown or closed session")
        releaser = self.releasers[row[1]]
        try:
            return releaser.session(session_id)[1]
        except InvalidInput:
            pass
        terms = SessionTerms.model_validate_json(row[2])
        m = np.frombuffer(row[3], dtype="<f8").reshape(json.loads(row[4]))
        scaling = None
        if row[5] is not None:
            scaling = Scaling(np.frombuffer(row[5], "<f8"), np.frombuffer(row[6], "<f8"))
        return releaser.restore_session(session_id, terms, m, TargetDisclosure(scaling, None))

    def _session(self, peer: str, session_id: str) -> tuple[SourceReleaser, SessionInfo]:
        row = self.conn.execute(
            "SELECT dataset FROM sessions WHERE session_id=?", (session_id,)
        ).fetchone()
        if row is None:
            raise InvalidInput("unknown or closed session")
        info = self._load_session(peer, session_id)
        return self.releasers[row[0]], info

    def projection(self, peer: str, session_id: str) -> np.ndarray:
        with self.lock:
            return self._session(peer, session_id)[1].projection

    def close_session(self, peer: str, session_id: str) -> None:
        with self.lock:
            releaser, _ = self._session(peer, session_id)
            self.conn.execute("UPDATE sessions SET closed=1 WHERE session_id=?", (session_id,))
            releaser.close_session(session_id)

    # -------------------------------------------------------------------------- releases
    def release_batches(
        self, peer: str, session_id: str, start: int, count: int, ledger_head: str
    ) -> Iterator[SignedRelease]:
        if count < 1 or count > self.max_batches or start < 0:
            raise InvalidInput("batch range out of bounds")
        with self.lock:
            releaser, info = self._session(peer, session_id)
            if start + count > info.plan.steps:
                raise InvalidInput("batch range out of bounds")
            if ledger_head != head_hash(self.ledger.store.entries(releaser.dataset)):
                raise LedgerCorrupt("ledger heads differ: sync the ledger first")
        for index in range(start, start + count):
            with self.lock:  # charge, draw and store atomically; send outside the lock
                signed = self._release_one(peer, releaser, session_id, index)
            yield signed

    def _release_one(
        self, peer: str, releaser: SourceReleaser, session_id: str, index: int
    ) -> SignedRelease:
        rid = f"{session_id}/{index}"
        ds = releaser.dataset
        existing = next((e for e in self.ledger.store.entries(ds) if e.request_id == rid), None)
        if existing is not None:
            stored = self._stored_payload(ds, existing, releaser, session_id, index)
            if stored is not None:
                return SignedRelease(stored, self._sign(ds, existing.seq))
            # Entry durable but payload never stored: it never left. Draw it now, uncharged.
            rel = releaser.draw(session_id, index, existing)
        else:
            prior_peer = [
                event_from_json(e.dp_event)
                for e in self.ledger.store.entries(ds)
                if e.peer == self.peers[peer].name
            ]
            rel = releaser.release(
                session_id,
                index,
                peer=self.peers[peer].name,
                extra_caps=[("peer", self.peers[peer].epsilon_cap, prior_peer)],
            )
        self._store_payload(ds, rel, rid)
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
            index, z, np.frombuffer(row[2], "<i8"), info.plan.spec(terms), entry.seq
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
        self, peer: str, session_id: str, index: int, queries: np.ndarray, ledger_head: str
    ) -> tuple[PateAnswer, LedgerEntry]:
        if index < 0:
            raise InvalidInput("query index out of bounds")
        with self.lock:
            releaser, _ = self._session(peer, session_id)
            releaser.check_queries(session_id, queries)
            ds = releaser.dataset
            entries = self.ledger.store.entries(ds)
            rid = f"{session_id}/pate/{index}"
            existing = next((e for e in entries if e.request_id == rid), None)
            if existing is not None:
                if existing.params.get("queries_sha256") != queries_digest(queries):
                    raise InvalidInput("a replayed request id with altered content")
                row = self.conn.execute(
                    "SELECT labels FROM pate_answers WHERE dataset=? AND seq=?",
                    (ds, existing.seq),
                ).fetchone()
                if row is not None:
                    ans = PateAnswer(np.frombuffer(row[0], "<i8"), existing.seq)
                    return ans, self._sign(ds, existing.seq)
                ans = releaser.draw_answer(session_id, queries, existing)
            else:
                if ledger_head != head_hash(entries):
                    raise LedgerCorrupt("ledger heads differ: sync the ledger first")
                name = self.peers[peer].name
                prior = [event_from_json(e.dp_event) for e in entries if e.peer == name]
                ans = releaser.answer(
                    session_id,
                    index,
                    queries,
                    peer=name,
                    extra_caps=[("peer", self.peers[peer].epsilon_cap, prior)],
                )
            self.conn.execute(
                "INSERT INTO pate_answers VALUES (?, ?, ?, ?)",
                (ds, ans.ledger_seq, rid, ans.payload_bytes()),
            )
            return ans, self._sign(ds, ans.ledger_seq)

    # ------------------------------------------------------------------------ ledger sync
    def countersign(self, peer: str, dataset: str, seq: int, target_sig: str) -> None:
        with self.lock:
            entries = self.ledger.store.entries(dataset)
            if not (0 <= seq < len(entries)) or entries[seq].peer != self.peers[peer].name:
                raise InvalidInput("no such ledger entry for this peer")
            pub = signing.load_public(self.peers[peer].signing_public_key)
            if not signing.verify(pub, entries[seq].signed_message(), target_sig):
                raise PeerMisbehaved("countersignature does not verify")
            self.ledger.store.update_signatures(dataset, seq, "", "", target_sig)

    def ledger_entries(self, peer: str, dataset: str, since: int) -> list[str]:
        if dataset not in self.releasers:
            raise InvalidInput("unknown dataset")
        if since < 0:
            raise InvalidInput("sequence number out of bounds")
        return [e.to_json() for e in self.ledger.store.entries(dataset)[since:]]
