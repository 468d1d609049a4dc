"""The target's typed peer: a ``ReleaseSource`` over gRPC that verifies everything it receives.

Release protocol, target side (DESIGN.md §3): (1) check the target's own ledger copy — if the
release would exceed the target's budget, do not ask; (2) send the request with the ledger head;
(4) on receipt verify the payload hash, the source's signature, the hash chain and that the
charge equals the target's own recomputation from public parameters; append the entry durably and
countersign. Any mismatch raises ``PeerMisbehaved`` and the job stops.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import grpc
import numpy as np

from dpda.data.preprocessing import PublicSpace
from dpda.dp.events import MetricSpec, event_from_json, event_to_json
from dpda.dp.ledger import LedgerEntry, PrivacyLedger, head_hash
from dpda.dp.pate import answers_event
from dpda.dp.sinkhorn_synthetic import points_per_class
from dpda.errors import (
    BudgetExceeded,
    ConfigError,
    DpdaError,
    InvalidInput,
    LedgerCorrupt,
    PeerMisbehaved,
)
from dpda.pb import dpda_pb2 as pb
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.planner import ReleasePlan, plan_batches
from dpda.protocol import (
    BatchRelease,
    ReweightingInfo,
    SessionInfo,
    TargetDisclosure,
    array_digest,
    payload_digest,
)
from dpda.public_source_terms import ReweightingPlan, ReweightingTerms, plan_reweighting
from dpda.service import responsive_io_threads, serde, signing
from dpda.service.audit import AuditLog, ClientAuditInterceptor
from dpda.service.config import TargetConfig
from dpda.service.crashpoints import crash_point
from dpda.service.tls import channel_credentials
from dpda.terms import SessionTerms

log = logging.getLogger("dpda.target")
# a source-space release has one column per source feature (the target's own count, checked
# by the job; this bound keeps a lying peer from sizing the identity the target builds)
MAX_SOURCE_SPACE_FEATURES = 1 << 14

_CODES = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: BudgetExceeded,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInput,
    grpc.StatusCode.FAILED_PRECONDITION: LedgerCorrupt,
    grpc.StatusCode.PERMISSION_DENIED: PeerMisbehaved,
}


def _translate(exc: grpc.RpcError) -> DpdaError:
    code = exc.code() if hasattr(exc, "code") else None
    cls = _CODES.get(code, DpdaError)
    detail = exc.details() if hasattr(exc, "details") else ""
    return cls(f"source refused: {detail}" if cls is not DpdaError else f"source error: {code}")


class _Retrying:
    """Calls the stub again, with exponential backoff, while the source is UNAVAILABLE.

    Safe because every request is idempotent: a release or an answer is identified by its
    request id (``session/index``), and the source returns the stored payload for a retried id
    without charging it again. Gives up after ``reconnect_s`` seconds.
    """

    def __init__(
        self,
        stub: pb_grpc.SourceServiceStub,
        reconnect_s: float,
        guard: Callable[[bool], None] = lambda dropped: None,
    ) -> None:
        self.stub = stub
        self.reconnect_s = reconnect_s
        self.guard = guard  # before each attempt: re-pins the source if the connection dropped

    def __getattr__(self, name: str):
        method = getattr(self.stub, name)

        def call(request, timeout=None):
            deadline = time.monotonic() + self.reconnect_s
            delay = 0.2
            dropped = False
            while True:
                self.guard(dropped)
                got: list[Any] = []
                try:
                    result = method(request, timeout=timeout)
                    if not hasattr(result, "__next__"):
                        return result
                    # a server stream is consumed here so that a broken stream is retried too;
                    # but what arrived before it broke is kept, not asked for again: it left
                    # the source (signed), which may have lost its own record of it since
                    for msg in result:
                        got.append(msg)
                    return got
                except grpc.RpcError as exc:
                    if got:
                        log.warning("the stream of %s broke after %d message(s)", name, len(got))
                        return got
                    code = exc.code() if hasattr(exc, "code") else None
                    if code != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                        raise
                    log.warning("source unavailable; retrying %s in %.1f s", name, delay)
                    time.sleep(delay)
                    delay = min(delay * 2, 5.0)
                    dropped = True

        return call


class GrpcReleaseSource:
    def __init__(self, cfg: TargetConfig, ledger: PrivacyLedger, audit: AuditLog) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.dataset = cfg.job.dataset
        self.key = signing.load_private(cfg.signing_key)
        self.source_pub = signing.load_public(
            cfg.source_signing_public_key, "source_signing_public_key"
        )
        # pin the source before any request carrying data goes out (issue 12, item 11): mTLS
        # alone let any holder of a certificate from the peer CA receive the target's basis and
        # column means. Raises PeerMisbehaved on another certificate.
        from dpda.service.tls import check_server_fingerprint

        check_server_fingerprint(
            cfg.source_address,
            cfg.tls.cert,
            cfg.tls.key,
            cfg.tls.peer_ca,
            cfg.source_fingerprint,
            timeout=min(cfg.timeout_s, 30.0),
            retry_s=cfg.reconnect_s,
        )
        creds = channel_credentials(cfg.tls.cert, cfg.tls.key, cfg.tls.peer_ca)
        channel = grpc.secure_channel(
            cfg.source_address,
            creds,
            options=[
                ("grpc.max_receive_message_length", serde.MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", serde.MAX_MESSAGE_BYTES),
            ],
        )
        self.channel = grpc.intercept_channel(
            channel, ClientAuditInterceptor(audit, cfg.source_fingerprint)
        )
        self.stub = _Retrying(pb_grpc.SourceServiceStub(self.channel), cfg.reconnect_s, self._guard)
        # gRPC reconnects on its own, to whoever listens at the address: every connection
        # state other than READY after the first READY means the next call may go to a new
        # server, so the pin is checked again first (``_guard``)
        self._dropped = threading.Event()
        self._was_ready = False

        def watch(state: grpc.ChannelConnectivity) -> None:
            if state is grpc.ChannelConnectivity.READY:
                self._was_ready = True
            elif self._was_ready:
                self._dropped.set()

        channel.subscribe(watch, try_to_connect=False)
        self._watch = watch
        self._raw_channel = channel
        self._sessions: dict[str, tuple[SessionTerms, SessionInfo]] = {}
        self._scalings: dict[str, tuple[str, str]] = {}  # session → the scaling it must bind
        self.job_file = cfg.state_dir / "job.json"
        # the charge check, append and countersignature of a received release run here, while
        # the job adapts to the release; every next request (and ``spent``) waits for them
        # the target's own signed ledger entry for its DP disclosures (issue 19), sent with the
        # session so the source can check the claim; "" under the exact opt-in
        self.target_claim = ""
        self._checker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dpda-verify")
        responsive_io_threads()
        self._pending: Future[None] | None = None
        self._ahead: Future[None] | None = None  # the ledger sync of compose_ahead
        self._composing: Future[None] | None = None  # and its first charge composed
        self.facts: pb.DescribeDatasetResponse | None = None  # the source's, from ``describe``

    def _guard(self, dropped: bool) -> None:
        """Before a call: if the connection dropped since the last check (a state change or an
        UNAVAILABLE), the certificate of whoever listens now must be the pinned one (a
        PeerMisbehaved ends the job); an unreachable source is left to the retry loop. The
        window between this handshake and gRPC's own reconnection stays open in principle (the
        Python API has no per-connection hook); it is milliseconds wide, not a whole restart."""
        if not (dropped or self._dropped.is_set()):
            return
        self._dropped.clear()
        from dpda.service.tls import check_server_fingerprint

        try:
            check_server_fingerprint(
                self.cfg.source_address,
                self.cfg.tls.cert,
                self.cfg.tls.key,
                self.cfg.tls.peer_ca,
                self.cfg.source_fingerprint,
                timeout=min(self.cfg.timeout_s, 10.0),
            )
        except PeerMisbehaved:
            raise
        except DpdaError:
            self._dropped.set()  # not listening yet: check again before the next attempt

    def settle(self) -> None:
        """Wait for the last release's charge check and countersignature; raise what failed.
        Also for ``compose_ahead``'s composition, so that the first pre-check finds it
        composed (it would wait for it in the accountant's cache anyway; the ledger store
        itself is locked)."""
        if self._composing is not None:
            composing, self._composing = self._composing, None
            composing.result()  # never raises: a failed composition only leaves a cache cold
        self._settle_release()

    def _settle_release(self) -> None:
        """``settle`` without the composition: ``sync_ledger`` runs on the checker's one
        thread ahead of that composition, so it must not wait for it."""
        if self._pending is not None:
            pending, self._pending = self._pending, None
            pending.result()

    def spent(self) -> float:
        """ε of the dataset in the target's own ledger, the last release included."""
        self.settle()
        return self.ledger.spent(self.dataset)

    def close(self) -> None:
        try:
            self.settle()
        finally:
            self._checker.shutdown(wait=True)
        # unsubscribed first: closing a watched channel waits for gRPC's connectivity poller
        # (measured 100–140 ms per job)
        self._raw_channel.unsubscribe(self._watch)
        self.channel.close()

    # ------------------------------------------------------------------------- preflight
    def describe(self, planned: SessionTerms | None = None) -> pb.DescribeDatasetResponse:
        """The source's public facts and budget numbers for this dataset; charges nothing.
        ``planned``: the terms this job means to open its session under, sent so the source
        plans them and composes their first charge while the target computes its basis (the
        terms are public to the source anyway; ``OpenSession`` sends them signed)."""
        req = pb.DescribeDatasetRequest(dataset=self.dataset)
        if planned is not None:
            req.planned_terms_json = planned.model_dump_json()
        try:
            resp = self.stub.DescribeDataset(req, timeout=self.cfg.timeout_s)
        except grpc.RpcError as exc:
            err = _translate(exc)
            if str(err).endswith(": unknown dataset"):
                raise ConfigError(
                    f"job.dataset: the source at {self.cfg.source_address} serves no dataset "
                    f"{self.dataset!r} (the name is one of the [[datasets]] in the source's "
                    "config; ask its operator)"
                ) from None
            raise err from None
        budget = (
            resp.dataset_epsilon_cap,
            resp.dataset_epsilon_spent,
            resp.peer_epsilon_cap,
            resp.peer_epsilon_spent,
            resp.epsilon_remaining,
        )
        if (
            min(resp.n_rows, resp.n_features) < 1
            or resp.n_classes < 0
            or not 0 < resp.delta < 1
            or not all(math.isfinite(v) and v >= 0 for v in budget)
        ):
            raise PeerMisbehaved("the source's description of its dataset is out of range")
        self.facts = resp
        return resp

    def preflight(
        self,
        n_features: int,
        delta: float,
        labeled: bool = True,
        planned: SessionTerms | None = None,
    ) -> pb.DescribeDatasetResponse:
        """What the target can check before it asks for anything: the source's public facts
        against its own rows and terms; a mismatch is a ``ConfigError`` naming the field.
        ``planned``: the job's terms, for the source to plan ahead (``describe``)."""
        facts = self.describe(planned)
        if labeled and facts.n_classes < 1:
            raise ConfigError(
                f"job.setting: the source's dataset {self.dataset!r} has no labels; it serves "
                "the public-source setting only"
            )
        if facts.n_features != n_features:
            raise ConfigError(
                f"job.data_path: the target's rows have {n_features} features, the source's "
                f"dataset {self.dataset!r} has {facts.n_features}"
            )
        if facts.delta != delta:
            raise ConfigError(
                f"job.delta: {delta:.6g}, but the source's dataset {self.dataset!r} uses "
                f"δ = {facts.delta!r}; leave job.delta out to take the source's δ"
            )
        return facts

    # ------------------------------------------------------------------------ ledger sync
    def sync_ledger(self) -> None:
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
        self._settle_release()
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
        self._countersign_again(resp.uncountersigned)

    def _countersign_again(self, seqs: Sequence[int]) -> None:
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
                self._countersign(entry)
            # else: charged at the source and never sent — there is nothing to countersign
        if restore:
            self._restore(restore)

    def _get_ledger(self, since: int) -> pb.GetLedgerResponse:
        try:
            return self.stub.GetLedger(
                pb.GetLedgerRequest(dataset=self.dataset, since_seq=since),
                timeout=self.cfg.timeout_s,
            )
        except grpc.RpcError as exc:
            raise _translate(exc) from None

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
            self.stub.RestoreLedger(req, timeout=self.cfg.timeout_s)
        except grpc.RpcError as exc:
            raise _translate(exc) from None

    def _countersign(self, entry: LedgerEntry) -> None:
        """Sign the entry as we hold it (its charge was verified when it was appended here)
        and send the signature."""
        target_sig = signing.sign(self.key, entry.signed_message())
        self.ledger.store.update_signatures(
            self.dataset, entry.seq, entry.payload_sha256, entry.source_sig, target_sig
        )
        try:
            self.stub.Countersign(
                pb.CountersignRequest(dataset=self.dataset, seq=entry.seq, target_sig=target_sig),
                timeout=self.cfg.timeout_s,
            )
        except grpc.RpcError as exc:
            err = _translate(exc)
            if not (isinstance(err, InvalidInput) and self._source_lost(entry)):
                raise err from None

    def _source_lost(self, entry: LedgerEntry) -> bool:
        """Whether the source, refusing to countersign ``entry``, lost it: it restarted on a
        file that lost its tail (or the write recording the entry's payload) while we
        countersigned. Then our copy, this countersignature included, is sent back (as
        ``sync_ledger`` does); nothing is released or charged again."""
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

    # -------------------------------------------------------------------------- sessions
    def _saved_session(self, terms: SessionTerms) -> str:
        """The session to resume: the saved one, if it ran under the same terms and the same
        target ``[privacy]`` policy (a session's queries are in one form only: a policy changed
        between a failure and the rerun opens a new session)."""
        if self.job_file.is_file():
            saved = json.loads(self.job_file.read_text())
            if (
                saved.get("terms") == terms.model_dump_json()
                and saved.get("privacy", "") == self.cfg.privacy.model_dump_json()
            ):
                return str(saved["session_id"])
        return ""

    def open_session(
        self, terms: SessionTerms, disclosure: TargetDisclosure, session_id: str | None = None
    ) -> SessionInfo:
        ahead, self._ahead = self._ahead, None
        if ahead is not None:
            # the sync started with the job; the first charge's composition may still run
            # (the pre-check and the plan check below wait for it, not for a second one)
            ahead.result()
        else:
            self.sync_ledger()  # settles the last release first
        # the audit record of this request carries the id of the target's own ledger entry for
        # what it discloses under DP (``audit report`` joins the two), else the terms' hash
        claim_id = json.loads(self.target_claim)["request_id"] if self.target_claim else ""
        resume = session_id or self._saved_session(terms)
        scaling = self._scaling_digests(disclosure)
        if resume:
            # the source keeps the scaling a session was opened with: this run's must be it,
            # checked before anything is asked (a release would be charged, then refused)
            self._check_resumed_scaling(resume, scaling)
        req = pb.OpenSessionRequest(
            request_id=claim_id
            or hashlib.sha256(terms.model_dump_json().encode()).hexdigest()[:32],
            terms_json=terms.model_dump_json(),
            session_id=resume,
            target_sig=signing.sign(self.key, terms.model_dump_json().encode()),
            target_claim_json=self.target_claim,
        )
        if disclosure.scaling is not None:
            req.scaling_mean.CopyFrom(serde.to_pb(disclosure.scaling.mean))
            req.scaling_std.CopyFrom(serde.to_pb(disclosure.scaling.std))
        if disclosure.basis is not None:
            req.basis.CopyFrom(serde.to_pb(disclosure.basis))
        std = None if disclosure.scaling is None else disclosure.scaling.std
        try:
            resp = self.stub.OpenSession(req, timeout=self.cfg.timeout_s)
            if resume and resp.session_id != resume:
                # another id would be another session: its releases (and the target's own
                # queries for it) charged again for the same job
                raise PeerMisbehaved("the source answered a resumed session with another id")
            if terms.source_space and terms.dpda:
                # the source's own space: the identity on its features, known to both (every
                # signed entry binds its digest, checked before a release is accepted)
                k = int(resp.n_features)
                if not (1 <= k <= MAX_SOURCE_SPACE_FEATURES):
                    raise PeerMisbehaved("the source's feature count is out of bounds")
                m = np.eye(k)
            elif disclosure.basis is not None and terms.dpda and not resume:
                # the source must use the target's own basis: every release's ledger entry,
                # signed, binds the digest of the projection it was computed with (checked
                # before the release is accepted)
                m = np.asarray(disclosure.basis, dtype=np.float64)
            else:
                # the source's JL matrix; PATE alone (its answers bind no projection); a
                # resumed session (the source keeps the projection it stored: one that is
                # not this run's basis is refused here, before anything is charged)
                proj = self.stub.GetProjection(
                    pb.GetProjectionRequest(session_id=resp.session_id),
                    timeout=self.cfg.timeout_s,
                )
                m = serde.from_pb(proj.projection, dtype="<f8", ndim=2)
        except grpc.RpcError as exc:
            raise _translate(exc) from None
        if disclosure.basis is not None and not np.array_equal(m, disclosure.basis):
            raise PeerMisbehaved("the source uses a projection other than the target's basis")
        crash_point("target.open_session.received")
        if not signing.verify(
            self.source_pub, (terms.model_dump_json() + resp.plan_json).encode(), resp.source_sig
        ):
            raise PeerMisbehaved("session terms are not signed by the pinned source key")
        plan = ReleasePlan.model_validate_json(resp.plan_json)
        bound = plan.attribute_bound if plan.attribute_bound is not None else 1.0
        recomputed = plan_batches(
            terms, int(resp.n_rows), m, attribute_bound=bound, scaling_std=std
        )
        if plan != recomputed:
            raise PeerMisbehaved("the source's release plan differs from the recomputed one")
        info = SessionInfo(
            resp.session_id, int(resp.n_rows), int(resp.n_features), int(resp.n_classes), m, plan
        )
        self._sessions[info.session_id] = (terms, info)
        self._scalings[info.session_id] = scaling
        self.job_file.write_text(
            json.dumps(
                {
                    "session_id": info.session_id,
                    "terms": terms.model_dump_json(),
                    "privacy": self.cfg.privacy.model_dump_json(),
                    "scaling": list(scaling),  # the digests its releases bind
                }
            )
        )
        return info

    @staticmethod
    def _scaling_digests(disclosure: TargetDisclosure) -> tuple[str, str]:
        """The digests of the scaling the target sent, as a ledger entry binds them."""
        sc = disclosure.scaling
        return (
            array_digest(None if sc is None else sc.mean),
            array_digest(None if sc is None else sc.std),
        )

    def _check_resumed_scaling(self, session_id: str, scaling: tuple[str, str]) -> None:
        """A resumed session's scaling is the one it was opened with: as job.json recorded it
        (saved since the digests were) and as its release entries so far bind it (PATE
        answers bind none)."""
        known: set[tuple[str, str]] = set()
        if self.job_file.is_file():
            saved = json.loads(self.job_file.read_text())
            if saved.get("session_id") == session_id and saved.get("scaling"):
                known.add((str(saved["scaling"][0]), str(saved["scaling"][1])))
        for e in self.ledger.store.entries(self.dataset):
            if e.session == session_id and "scaling_mean_sha256" in e.params:
                known.add(self._bound_scaling(e))
        if known - {scaling}:
            raise InvalidInput(
                "the saved session was opened with another scaling of the target's data (did "
                "the data or job.scaling change?): remove job.json to open a new session",
                public=True,
            )

    @staticmethod
    def _bound_scaling(entry: LedgerEntry) -> tuple[str, str]:
        """The scaling digests a (signed) ledger entry binds its release to."""
        return (
            str(entry.params.get("scaling_mean_sha256", "")),
            str(entry.params.get("scaling_std_sha256", "")),
        )

    def compose_ahead(self, terms: SessionTerms, scaling_std: np.ndarray | None) -> None:
        """Started as the job starts, in the background while the target computes its own
        part of the session (its basis, the clip norm): the ledger sync ``open_session`` would
        do first, then the session's plan and first charge composed onto the synced ledger —
        what the plan check and the pre-check (1) compute once the signed plan is back (cold,
        30–90 ms of PLD, measured, that would otherwise sit between OpenSession and the first
        release; the accountant's caches make a later ask wait for a composition in flight
        rather than start its own). ``open_session`` waits for the sync only. A release's event
        depends on the terms and the source's size (``describe``), not on the projection or
        the clip norm (only its sensitivity does), so an identity basis stands in for the
        target's; the real plan and check are computed again from what the source signs. A
        failed sync is ``open_session``'s error; a failed composition only leaves the cache
        cold."""
        facts = self.facts

        def compose() -> None:
            if facts is None:
                return
            try:
                n_rows, k = int(facts.n_rows), int(facts.n_features)
                m = np.eye(k, min(terms.projection_dim, k, n_rows))
                plan = plan_batches(terms, n_rows, m, scaling_std=scaling_std)
                if plan.releases > 0:
                    self.ledger.would_spend(self.dataset, [plan.release_spec(terms, 0).dp_event()])
            except Exception:  # caches only: the real plan and check report for themselves
                log.debug("composing the first charge ahead failed", exc_info=True)

        # one worker, in order: the composition runs after the sync, and ``open_session``
        # waits for the sync only
        self._ahead = self._checker.submit(self.sync_ledger)
        self._composing = self._checker.submit(compose)

    def close_session(self, session_id: str) -> None:
        self.settle()
        try:
            resp = self.stub.CloseSession(
                pb.CloseSessionRequest(session_id=session_id), timeout=self.cfg.timeout_s
            )
        except grpc.RpcError as exc:
            raise _translate(exc) from None
        self._countersign_again(resp.uncountersigned)
        self.job_file.unlink(missing_ok=True)
        self._scalings.pop(session_id, None)

    # -------------------------------------------------------------------------- releases
    def _synced(self, fn, *args):
        """Run ``fn``; if the source says the ledger heads differ (another session or peer
        released meanwhile), sync the ledger — verifying what arrives — and try once more."""
        try:
            return fn(*args)
        except LedgerCorrupt as exc:
            if "LEDGER_CORRUPT" not in str(exc):
                raise
            self.sync_ledger()
            return fn(*args)

    def release(self, session_id: str, index: int, peer: str = "") -> BatchRelease:
        return self._synced(self._release, session_id, index)

    def _release(self, session_id: str, index: int) -> BatchRelease:
        self.settle()
        terms, info = self._sessions[session_id]
        if not (0 <= index < info.plan.releases):
            raise InvalidInput("batch index out of range")
        spec = info.plan.release_spec(terms, index)
        rid = f"{session_id}/{index}"
        mine = self.ledger.store.entries(self.dataset)
        known = next((e for e in mine if e.request_id == rid), None)
        if known is None:
            self.ledger.check(self.dataset, [spec.dp_event()])  # (1) do not ask if over budget
        req = pb.ReleaseBatchesRequest(
            session_id=session_id,
            start=index,
            count=1,
            ledger_head=head_hash(mine),
            ledger_length=len(mine),
        )
        try:
            msgs = list(self.stub.ReleaseBatches(req, timeout=self.cfg.timeout_s))
        except grpc.RpcError as exc:
            raise _translate(exc) from None
        if len(msgs) != 1:
            raise PeerMisbehaved("the source sent the wrong number of batches")
        return self._accept(msgs[0], terms, info, index, rid, known)

    def query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray:
        """PATE: labels for ``queries``, verified and countersigned like any release."""
        return self._synced(self._query_teachers, session_id, index, queries)

    def _query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray:
        self.settle()
        terms, info = self._sessions[session_id]
        if info.plan.pate_scale is None:
            raise InvalidInput("PATE is not part of this session's terms")
        event = answers_event(terms.pate_aggregator, info.plan.pate_scale, queries.shape[0])
        rid = f"{session_id}/pate/{index}"
        mine = self.ledger.store.entries(self.dataset)
        known = next((e for e in mine if e.request_id == rid), None)
        if known is None:
            self.ledger.check(self.dataset, [event])  # do not ask beyond the target's budget
        req = pb.QueryTeachersRequest(
            session_id=session_id,
            index=index,
            queries=serde.to_pb(queries),
            ledger_head=head_hash(mine),
            ledger_length=len(mine),
        )
        try:
            resp = self.stub.QueryTeachers(req, timeout=self.cfg.timeout_s)
        except grpc.RpcError as exc:
            raise _translate(exc) from None
        labels = serde.from_pb(resp.labels, dtype="<i8", ndim=1, shape=(queries.shape[0],))
        if labels.min(initial=0) < 0 or labels.max(initial=0) >= info.n_classes:
            raise PeerMisbehaved("labels out of range")
        entry = LedgerEntry.from_json(resp.entry_json)
        digest = payload_digest(resp.labels.data)
        catch_up = [LedgerEntry.from_json(t) for t in resp.catch_up_json]
        self._verify_entry(entry, digest, resp.payload_sha256, rid, event, known, catch_up=catch_up)
        return labels

    def _verify_entry(
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
        if scaling is not None and self._bound_scaling(entry) != scaling:
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
        self._countersign(entry)
        crash_point("target.release.countersigned")
        if more:  # the session's next batch charges the same event again
            self.ledger.would_spend(self.dataset, [event])

    def _accept(
        self,
        msg: pb.BatchRelease,
        terms: SessionTerms,
        info: SessionInfo,
        index: int,
        rid: str,
        known: LedgerEntry | None,
    ) -> BatchRelease:
        spec = info.plan.release_spec(terms, index)
        ell = info.projection.shape[1]
        width = 2 * ell if terms.release == "class-gaussians" else ell
        rows = None if terms.release == "rows" else info.n_classes
        metric = isinstance(spec, MetricSpec)
        n_counts = 0 if metric else info.n_classes
        counts = serde.from_pb(msg.noisy_counts, dtype="<i8", ndim=1, shape=(n_counts,))
        if metric:  # the learned W: d′ × ℓ, nothing else
            rows, width = terms.metric_rows, ell
        elif terms.release == "sinkhorn-synthetic":  # its size follows from the noisy counts
            rows = int(
                points_per_class(
                    counts, terms.synthetic_points, terms.synthetic_rows_per_point
                ).sum()
            )
        z = serde.from_pb(msg.z, dtype="<f8", ndim=2, shape=(rows, width))
        digest = payload_digest(msg.z.data, msg.noisy_counts.data)
        entry = LedgerEntry.from_json(msg.entry_json)
        if int(msg.index) != index:
            raise PeerMisbehaved("ledger entry is for another request")
        more = index + 1 < info.plan.releases
        catch_up = [LedgerEntry.from_json(t) for t in msg.catch_up_json]
        self._verify_entry(
            entry, digest, msg.payload_sha256, rid, spec.dp_event(), known, more, catch_up,
            info.projection, self._scalings.get(info.session_id),
        )  # fmt: skip
        return BatchRelease(index, z, counts, spec, entry.seq)

    # ---------------------------------------------------- reweighting (the reverse shape)
    def open_reweighting(
        self,
        terms: ReweightingTerms,
        rows: np.ndarray,
        labels: np.ndarray | None,
        space: PublicSpace,
    ) -> ReweightingInfo:
        """Open a reweighting session on the serving daemon's private rows: our public rows and
        the map of its rows into their space go out; the plan it signs must be ours."""
        self.sync_ledger()
        terms_json = terms.model_dump_json()
        req = pb.OpenReweightingRequest(
            terms_json=terms_json,
            rows=serde.to_pb(rows),
            scaling_mean=serde.to_pb(space.scaling.mean),
            scaling_std=serde.to_pb(space.scaling.std),
            basis=serde.to_pb(space.basis),
            scale=space.scale,
            target_sig=signing.sign(self.key, terms_json.encode()),
        )
        if labels is not None:
            req.labels.CopyFrom(serde.to_pb(np.asarray(labels, dtype=np.float64)))
        try:
            resp = self.stub.OpenReweighting(req, timeout=self.cfg.timeout_s)
        except grpc.RpcError as exc:
            raise _translate(exc) from None
        if not signing.verify(
            self.source_pub, (terms_json + resp.plan_json).encode(), resp.source_sig
        ):
            raise PeerMisbehaved("session terms are not signed by the pinned source key")
        plan = ReweightingPlan.model_validate_json(resp.plan_json)
        if plan != plan_reweighting(terms):
            raise PeerMisbehaved("the source's reweighting plan differs from the recomputed one")
        if resp.n_rows < 1:
            raise PeerMisbehaved("the source's row count is out of range")
        return ReweightingInfo(resp.session_id, int(resp.n_rows), plan, rows.shape[0])

    def reweight_steps(self, info: ReweightingInfo, start: int, count: int) -> np.ndarray:
        """Steps ``start … start+count−1``: the holder's DP outputs, verified and countersigned
        like any release (vertices, or noisy gradients for noisy-md)."""
        return self._synced(self._reweight_steps, info, start, count)

    def _reweight_steps(self, info: ReweightingInfo, start: int, count: int) -> np.ndarray:
        self.settle()
        event = info.plan.event(count)
        rid = f"{info.session_id}/reweight/{start}"
        mine = self.ledger.store.entries(self.dataset)
        known = next((e for e in mine if e.request_id == rid), None)
        if known is None:
            self.ledger.check(self.dataset, [event])  # do not ask beyond the target's budget
        req = pb.ReweightStepsRequest(
            session_id=info.session_id,
            start=start,
            count=count,
            ledger_head=head_hash(mine),
            ledger_length=len(mine),
        )
        try:
            resp = self.stub.ReweightSteps(req, timeout=self.cfg.timeout_s)
        except grpc.RpcError as exc:
            raise _translate(exc) from None
        if info.plan.method == "noisy-md":
            out = serde.from_pb(resp.gradients, dtype="<f8", ndim=2, shape=(count, info.n_public))
            digest = payload_digest(resp.gradients.data)
        else:
            out = serde.from_pb(resp.vertices, dtype="<i8", ndim=1, shape=(count,))
            digest = payload_digest(resp.vertices.data)
            if out.min() < 0 or out.max() >= info.n_public:
                raise PeerMisbehaved("a selected row is out of range")
        entry = LedgerEntry.from_json(resp.entry_json)
        catch_up = [LedgerEntry.from_json(t) for t in resp.catch_up_json]
        more = start + count < info.plan.steps
        self._verify_entry(entry, digest, resp.payload_sha256, rid, event, known, more, catch_up)
        return out
