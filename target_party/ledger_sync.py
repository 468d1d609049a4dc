"""The target's copy of the dataset's ledger kept in step with the source's.

``LedgerSync`` verifies what the source sends (signatures, the chain, the charge against the
target's own recomputation), appends it durably and countersigns it, on one background thread
(the verification thread) while the job adapts to a release; it sends back the target's doubly
signed copy when the source lost a tail. ``ResumeFile`` is ``job.json``: the session a failed
job resumes, and the scaling that session's releases bind.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from dpda.dp.events import event_from_json, event_to_json
from dpda.dp.ledger import LedgerEntry, PrivacyLedger, head_hash
from dpda.errors import InvalidInput, LedgerCorrupt, PeerMisbehaved
from dpda.pb import dpda_pb2 as pb
from dpda.protocol import TargetDisclosure, array_digest
from dpda.service import responsive_io_threads, signing
from dpda.service.crashpoints import crash_point
from dpda.service.keyfiles import write_atomic
from dpda.target_party.transport import Retrying, translate
from dpda.terms import SessionTerms

log = logging.getLogger("dpda.target")


def bound_scaling(entry: LedgerEntry) -> tuple[str, str]:
    """The scaling digests a (signed) ledger entry binds its release to."""
    return (
        str(entry.params.get("scaling_mean_sha256", "")),
        str(entry.params.get("scaling_std_sha256", "")),
    )


def scaling_digests(disclosure: TargetDisclosure) -> tuple[str, str]:
    """The digests of the scaling the target sent, as a ledger entry binds them."""
    sc = disclosure.scaling
    return (
        array_digest(None if sc is None else sc.mean),
        array_digest(None if sc is None else sc.std),
    )


class LedgerSync:
    """The dataset's ledger, target side: sync and restore against the source, verification,
    append and countersignature of what the source releases.

    Every request goes through ``stub``; the charge check, append and countersignature of a
    release run on one worker thread, and ``settle`` waits for them.
    """

    def __init__(
        self,
        ledger: PrivacyLedger,
        dataset: str,
        stub: Retrying,
        key: Any,
        source_pub: Any,
        timeout_s: float,
    ) -> None:
        self.ledger = ledger
        self.dataset = dataset
        self.stub = stub
        self.key = key
        self.source_pub = source_pub
        self.timeout_s = timeout_s
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpda-verify")
        responsive_io_threads()
        self._pending: Future[None] | None = None

    def submit(self, fn: Callable[[], None]) -> Future[None]:
        """Run ``fn`` on the verification thread, after everything submitted before it."""
        return self._checker.submit(fn)

    def settle(self) -> None:
        """Wait for the last release's charge check and countersignature; raise what failed."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def close(self) -> None:
        try:
            self.settle()
        finally:
            self._checker.shutdown(wait=True)

    def precheck(self, rid: str, event: Any) -> tuple[list[LedgerEntry], LedgerEntry | None]:
        """The entries held here, and the one for request ``rid`` if it was released before.
        A new request is checked against the target's own budget first: over it, it is not
        asked for (``BudgetExceeded``)."""
        mine = self.ledger.store.entries(self.dataset)
        known = next((e for e in mine if e.request_id == rid), None)
        if known is None:
            self.ledger.check(self.dataset, [event])
        return mine, known

    # ------------------------------------------------------------------------ sync
    def sync(self) -> None:
        """Bring the two copies of the dataset's ledger together, verifying what arrives.

        * the source's new entries are checked (its signature, the chain, the charge) and
          appended here;
        * if the source has *fewer* entries than we hold (it lost a tail: a truncated file, a
          lost WAL), our copy (signed by it, countersigned by us) is sent back
          (``RestoreLedger``) after checking that its head is a prefix of ours; nothing is
          released or charged again;
        * our own releases the source holds without our countersignature (a ``Countersign``
          lost in a crash) are countersigned again, so the source may release the next one.
        """
        self.settle()
        mine = self.ledger.store.entries(self.dataset)
        resp = self._get_ledger(len(mine))
        if resp.length < len(mine):
            self._restore_source_tail(mine, int(resp.length), resp.head)
            resp = self._get_ledger(len(mine))
        entries = [LedgerEntry.from_json(text) for text in resp.entries_json]
        for entry in entries:
            # an unsigned entry was charged and never sent (the source stopped before signing)
            if entry.source_sig and not signing.verify(
                self.source_pub, entry.signed_message(), entry.source_sig
            ):
                raise PeerMisbehaved("a synced ledger entry has a bad source signature")
        if entries:
            # one composition for the whole sync: the newest entry's spend must recompute
            # (every intermediate spend is rechecked by `dpda ledger verify`)
            events = [event_from_json(e.dp_event) for e in entries]
            if abs(self.ledger.would_spend(self.dataset, events) - entries[-1].spend_after) > 1e-9:
                raise PeerMisbehaved("the synced ledger's spend does not recompute")
        for entry in entries:
            self.ledger.store.append(entry)  # raises LedgerCorrupt if the chain does not link
        held = self.ledger.store.entries(self.dataset)
        if head_hash(held) != resp.head:
            raise PeerMisbehaved("the source's ledger head differs from its own entries")
        self.countersign_again(resp.uncountersigned)

    def countersign_again(self, seqs: Sequence[int]) -> None:
        """Countersign again our own releases the source holds without our countersignature
        (it lost it: a crash, or the last writes of its disk). Every entry held here passed
        the charge check before it was appended."""
        held = self.ledger.store.entries(self.dataset)
        restore = []
        for seq in seqs:
            if not (0 <= seq < len(held)):
                raise PeerMisbehaved("the source names a ledger entry it does not have")
            entry = held[seq]
            if entry.source_sig and entry.target_sig:
                restore.append(entry)  # the source lost its copy of the signatures: send ours
            elif entry.source_sig:
                self.countersign(entry)
            # else: charged at the source and never sent — there is nothing to countersign
        if restore:
            self._restore(restore)

    def _get_ledger(self, since: int) -> pb.GetLedgerResponse:
        try:
            return self.stub.GetLedger(
                pb.GetLedgerRequest(dataset=self.dataset, since_seq=since),
                timeout=self.timeout_s,
            )
        except grpc.RpcError as exc:
            raise translate(exc) from None

    def _restore_source_tail(self, mine: list[LedgerEntry], length: int, head: str) -> None:
        if head != head_hash(mine[:length]):
            raise PeerMisbehaved("the source's ledger is not a prefix of the target's copy")
        tail = mine[length:]
        if any(not (e.source_sig and e.target_sig) for e in tail):
            raise LedgerCorrupt("the source lost entries this target never countersigned")
        log.warning(
            "the source lost %d ledger entries of %s: sending back our countersigned copy",
            len(tail),
            self.dataset,
        )
        self._restore(tail)

    def _restore(self, entries: Sequence[LedgerEntry]) -> None:
        """Send our doubly-signed copy of ``entries`` (the source verifies both signatures)."""
        req = pb.RestoreLedgerRequest(
            dataset=self.dataset, entries_json=[e.to_json() for e in entries]
        )
        try:
            self.stub.RestoreLedger(req, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise translate(exc) from None

    def countersign(self, entry: LedgerEntry) -> None:
        """Sign the entry as we hold it (its charge was verified when it was appended here)
        and send the signature."""
        target_sig = signing.sign(self.key, entry.signed_message())
        self.ledger.store.update_signatures(
            self.dataset, entry.seq, entry.payload_sha256, entry.source_sig, target_sig
        )
        try:
            self.stub.Countersign(
                pb.CountersignRequest(dataset=self.dataset, seq=entry.seq, target_sig=target_sig),
                timeout=self.timeout_s,
            )
        except grpc.RpcError as exc:
            err = translate(exc)
            if not (isinstance(err, InvalidInput) and self._source_lost(entry)):
                raise err from None

    def _source_lost(self, entry: LedgerEntry) -> bool:
        """Whether the source, refusing to countersign ``entry``, lost it: it restarted on a
        file that lost its tail (or the write recording the entry's payload) while we
        countersigned. Then our copy, this countersignature included, is sent back (as
        ``sync`` does); nothing is released or charged again."""
        resp = self._get_ledger(entry.seq)
        if resp.length > entry.seq:
            theirs = LedgerEntry.from_json(resp.entries_json[0])
            if theirs.entry_hash() != entry.entry_hash() or theirs.payload_sha256:
                return False
            # it holds the charge but lost the write that recorded the payload (and its
            # signature): our doubly-signed copy completes it
            self._restore([self.ledger.store.entries(self.dataset)[entry.seq]])
            return True
        mine = self.ledger.store.entries(self.dataset)
        self._restore_source_tail(mine, int(resp.length), resp.head)
        return True

    # ------------------------------------------------------------------ verification
    def verify_entry(
        self,
        entry: LedgerEntry,
        digest: str,
        claimed: str,
        rid: str,
        event: object,
        known: LedgerEntry | None,
        more: bool = False,
        catch_up: list[LedgerEntry] | None = None,
        projection: np.ndarray | None = None,
        scaling: tuple[str, str] | None = None,
    ) -> None:
        """Payload hash, signature, request, event (and for a release the projection and
        the scaling it was computed with) now; the charge check, append and countersignature
        in the background (``settle`` waits for them)."""
        if digest != claimed or entry.payload_sha256 != digest:
            raise PeerMisbehaved("payload hash does not match")
        if not signing.verify(self.source_pub, entry.signed_message(), entry.source_sig):
            raise PeerMisbehaved("ledger entry is not signed by the pinned source key")
        if entry.request_id != rid or entry.dataset != self.dataset:
            raise PeerMisbehaved("ledger entry is for another request")
        if entry.dp_event != event_to_json(event):
            raise PeerMisbehaved("the charged event differs from the agreed mechanism")
        if known is not None and known.body() != entry.body():
            raise PeerMisbehaved("a retried release came back with a different entry")
        if projection is not None and entry.params.get("projection_sha256") != array_digest(
            projection
        ):
            raise PeerMisbehaved("the release was computed with another projection")
        if scaling is not None and bound_scaling(entry) != scaling:
            raise PeerMisbehaved("the release was computed with another scaling")
        for e in catch_up or []:
            if e.source_sig and not signing.verify(
                self.source_pub, e.signed_message(), e.source_sig
            ):
                raise PeerMisbehaved("a caught-up ledger entry has a bad source signature")
        self._pending = self._checker.submit(
            self._charge_and_countersign, entry, event, known, more, catch_up or []
        )

    def _charge_and_countersign(
        self,
        entry: LedgerEntry,
        event: object,
        known: LedgerEntry | None,
        more: bool,
        catch_up: list[LedgerEntry],
    ) -> None:
        """The charge must equal the target's own recomputation; then the entry is appended
        durably and countersigned. Runs while the job adapts to the release (the payload is
        already here; nothing more is asked before this has passed). Afterwards the same
        event's next charge is composed ahead (a cache warm-up for the next pre-check)."""
        for e in catch_up:  # other sessions' releases since our last contact, chained in
            try:
                self.ledger.store.append(e)
            except LedgerCorrupt:
                raise PeerMisbehaved("caught-up ledger entries do not link to our copy") from None
        if known is None:
            # the charge recomputed over every entry (caught-up ones included); over the
            # target's own budget it stops here, the release unused
            expected = self.ledger.check(self.dataset, [event])
            if abs(expected - entry.spend_after) > 1e-9:
                raise PeerMisbehaved("the charge differs from the target's recomputation")
            self.ledger.store.append(entry)
            crash_point("target.release.appended")
        self.countersign(entry)
        crash_point("target.release.countersigned")
        if more:  # the session's next batch charges the same event again
            self.ledger.would_spend(self.dataset, [event])


class ResumeFile:
    """``job.json`` in the target's state directory: the open session a rerun of the same job
    resumes, with the terms, the target ``[privacy]`` policy and the scaling it ran under."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def saved_session(self, terms: SessionTerms, privacy: str) -> str:
        """The session to resume: the saved one, if it ran under the same terms and the same
        target ``[privacy]`` policy (``privacy``, as JSON; a session's queries are in one form
        only: a policy changed between a failure and the rerun opens a new session)."""
        if self.path.is_file():
            saved = json.loads(self.path.read_text())
            if (
                saved.get("terms") == terms.model_dump_json()
                and saved.get("privacy", "") == privacy
            ):
                return str(saved["session_id"])
        return ""

    def check_scaling(
        self, session_id: str, scaling: tuple[str, str], entries: Sequence[LedgerEntry]
    ) -> None:
        """A resumed session's scaling is the one it was opened with: as the file recorded it
        (saved since the digests were) and as its release ``entries`` so far bind it (PATE
        answers bind none)."""
        known: set[tuple[str, str]] = set()
        if self.path.is_file():
            saved = json.loads(self.path.read_text())
            if saved.get("session_id") == session_id and saved.get("scaling"):
                known.add((str(saved["scaling"][0]), str(saved["scaling"][1])))
        for e in entries:
            if e.session == session_id and "scaling_mean_sha256" in e.params:
                known.add(bound_scaling(e))
        if known - {scaling}:
            raise InvalidInput(
                "the saved session was opened with another scaling of the target's data (did "
                "the data or job.scaling change?): remove job.json to open a new session",
                public=True,
            )

    def save(
        self, session_id: str, terms: SessionTerms, privacy: str, scaling: tuple[str, str]
    ) -> None:
        write_atomic(
            self.path,
            json.dumps(
                {
                    "session_id": session_id,
                    "terms": terms.model_dump_json(),
                    "privacy": privacy,
                    "scaling": list(scaling),  # the digests its releases bind
                }
            ).encode(),
        )

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
