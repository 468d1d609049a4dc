"""The target's typed peer: a ``ReleaseSource`` over gRPC that verifies everything it receives.

Release protocol, target side (docs/architecture.md, "A release's path"): (1) check the target's
own ledger copy — if the
release would exceed the target's budget, do not ask; (2) send the request with the ledger head;
(4) on receipt verify the payload hash, the source's signature, the hash chain and that the
charge equals the target's own recomputation from public parameters; append the entry durably and
countersign. Any mismatch raises ``PeerMisbehaved`` and the job stops.

The channel (pinning, retries) is ``transport``'s; the ledger copy and job.json ``ledger_sync``'s.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
import numpy as np

from dpda.data.preprocessing import PublicSpace
from dpda.dp.events import BatchSpec, MetricSpec
from dpda.dp.ledger import LedgerEntry, PrivacyLedger, head_hash
from dpda.dp.pate import answers_event
from dpda.dp.sinkhorn_synthetic import points_per_class
from dpda.errors import ConfigError, InvalidInput, LedgerBehind, PeerMisbehaved
from dpda.pb import dpda_pb2 as pb
from dpda.planner import ReleasePlan, plan_batches
from dpda.protocol import (
    BatchRelease,
    RequestId,
    ReweightingInfo,
    SessionInfo,
    TargetDisclosure,
    payload_digest,
)
from dpda.public_source_terms import ReweightingPlan, ReweightingTerms, plan_reweighting
from dpda.service import serde, signing
from dpda.service.audit import AuditLog
from dpda.service.config import TargetConfig
from dpda.service.crashpoints import crash_point
from dpda.target_party.ledger_sync import LedgerSync, ResumeFile, scaling_digests
from dpda.target_party.transport import SourceTransport, translate
from dpda.terms import SessionTerms

log = logging.getLogger("dpda.target")
# a source-space release has one column per source feature (the target's own count, checked
# by the job; this bound keeps a lying peer from sizing the identity the target builds)
MAX_SOURCE_SPACE_FEATURES = 1 << 14

T = TypeVar("T")
# a batch's payload as read: z, the noisy counts, its spec and the standardization it carries
_Batch = tuple[
    np.ndarray, np.ndarray, BatchSpec | MetricSpec, tuple[np.ndarray, np.ndarray, float] | None
]


@dataclass(frozen=True)
class _Answer(Generic[T]):
    """A source's answer to one release request, read: the payload, the SHA-256 of its wire
    bytes as received, and what the source sent beside it (the digest it claims, its ledger
    entry and the entries before it the target lacks)."""

    payload: T
    digest: str
    claimed: str
    entry_json: str
    catch_up_json: Sequence[str]

    @classmethod
    def of(cls, payload: T, msg: Any, digest: str) -> _Answer[T]:
        """From a response message with ``payload_sha256``, ``entry_json`` and
        ``catch_up_json`` (every release kind's)."""
        return cls(payload, digest, msg.payload_sha256, msg.entry_json, list(msg.catch_up_json))


class GrpcReleaseSource:
    """The release client of a target job: one source, one dataset, over gRPC.

    It checks the source's public facts against the job (``preflight``), opens or resumes a
    session whose plan it recomputes (``open_session``), and asks for releases, PATE answers
    and reweighting steps, each pre-checked against the target's own budget and verified on
    receipt. ``transport`` is the pinned channel (``stub``, ``channel``); ``ledger_sync`` the
    target's ledger copy, kept in step with the source's and countersigned in the background.
    """

    def __init__(self, cfg: TargetConfig, ledger: PrivacyLedger, audit: AuditLog) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.dataset = cfg.job.dataset
        self.key = signing.load_private(cfg.signing_key)
        self.source_pub = signing.load_public(
            cfg.source_signing_public_key, "source_signing_public_key"
        )
        self.transport = SourceTransport(cfg, audit)  # pins the source before anything is sent
        self.stub = self.transport.stub
        self.channel = self.transport.channel
        self._raw_channel = self.transport.raw_channel
        self._sessions: dict[str, tuple[SessionTerms, SessionInfo]] = {}
        self._scalings: dict[str, tuple[str, str]] = {}  # session → the scaling it must bind
        self.job_file = cfg.state_dir / "job.json"
        self.resume = ResumeFile(self.job_file)
        # the target's own signed ledger entry for its DP disclosures, sent with the session
        # so the source can check the claim; "" under the exact opt-in
        self.target_claim = ""
        # the charge check, append and countersignature of a received release run on the
        # ledger's verification thread, while the job adapts to the release; every next
        # request (and ``spent``) waits for them
        self.ledger_sync = LedgerSync(
            ledger, self.dataset, self.stub, self.key, self.source_pub, cfg.timeout_s
        )
        self._ahead: Future[None] | None = None  # the ledger sync of compose_ahead
        self._composing: Future[None] | None = None  # and its first charge composed
        self.facts: pb.DescribeDatasetResponse | None = None  # the source's, from ``describe``

    def settle(self) -> None:
        """Wait for the last release's charge check and countersignature; raise what failed.
        Also for ``compose_ahead``'s composition, so that the first pre-check finds it
        composed (it would wait for it in the accountant's cache anyway; the ledger store
        itself is locked)."""
        if self._composing is not None:
            composing, self._composing = self._composing, None
            composing.result()  # never raises: a failed composition only leaves a cache cold
        self.ledger_sync.settle()

    def spent(self) -> float:
        """ε of the dataset in the target's own ledger, the last release included."""
        self.settle()
        return self.ledger.spent(self.dataset)

    def close(self) -> None:
        try:
            self.settle()
        finally:
            self.ledger_sync.close()
        self.transport.close()

    def sync_ledger(self) -> None:
        """Bring the two copies of the dataset's ledger together (``LedgerSync.sync``)."""
        self.ledger_sync.sync()

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
            err = translate(exc)
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

    # -------------------------------------------------------------------------- sessions
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
        resume = session_id or self.resume.saved_session(terms, self.cfg.privacy.model_dump_json())
        scaling = scaling_digests(disclosure)
        if resume:
            # the source keeps the scaling a session was opened with: this run's must be it,
            # checked before anything is asked (a release would be charged, then refused)
            self.resume.check_scaling(resume, scaling, self.ledger.store.entries(self.dataset))
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
            raise translate(exc) from None
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
        self.resume.save(info.session_id, terms, self.cfg.privacy.model_dump_json(), scaling)
        return info

    def compose_ahead(self, terms: SessionTerms, scaling_std: np.ndarray | None) -> None:
        """Started as the job starts, in the background while the target computes its own part of
        the session (its basis, the clip norm): the ledger sync ``open_session`` would do first,
        then the session's plan and first charge composed onto the synced ledger — what the plan
        check and the pre-check (1) compute once the signed plan is back (cold PLD compositions that
        would otherwise sit between OpenSession and the first release: docs/results.md, "Service
        overhead"; the accountant's caches make a later ask wait for a composition in flight rather
        than start its own). ``open_session`` waits for the sync only. A release's event depends on
        the terms and the source's size (``describe``), not on the projection or the clip norm (only
        its sensitivity does), so an identity basis stands in for the target's; the real plan and
        check are computed again from what the source signs. A failed sync is ``open_session``'s
        error; a failed composition only leaves the cache cold."""
        facts = self.facts

        def compose() -> None:
            if facts is None:
                return
            try:
                n_rows, k = int(facts.n_rows), int(facts.n_features)
                m = np.eye(k, min(terms.projection_dim, k, n_rows))
                plan = plan_batches(terms, n_rows, m, scaling_std=scaling_std)
                if plan.releases > 0:
                    self.ledger.would_spend(self.dataset, [plan.charged_event(terms, 0)])
            except Exception:  # caches only: the real plan and check report for themselves
                log.debug("composing the first charge ahead failed", exc_info=True)

        # one worker, in order: the composition runs after the sync, and ``open_session``
        # waits for the sync only
        self._ahead = self.ledger_sync.submit(self.sync_ledger)
        self._composing = self.ledger_sync.submit(compose)

    def close_session(self, session_id: str) -> None:
        self.settle()
        try:
            resp = self.stub.CloseSession(
                pb.CloseSessionRequest(session_id=session_id), timeout=self.cfg.timeout_s
            )
        except grpc.RpcError as exc:
            raise translate(exc) from None
        self.ledger_sync.countersign_again(resp.uncountersigned)
        self.resume.remove()
        self._scalings.pop(session_id, None)

    # -------------------------------------------------------------------------- releases
    def _synced(self, fn, *args):
        """Run ``fn``; if the source says the ledger heads differ (another session or peer
        released meanwhile), sync the ledger — verifying what arrives — and try once more."""
        try:
            return fn(*args)
        except LedgerBehind:
            self.sync_ledger()
            return fn(*args)

    def release(self, session_id: str, index: int, peer: str = "") -> BatchRelease:
        return self._synced(self._release, session_id, index)

    def _ask_verified(
        self,
        rid: RequestId,
        event: object,
        ask: Callable[[str, int], _Answer[T]],
        more: bool = False,
        projection: np.ndarray | None = None,
        scaling: tuple[str, str] | None = None,
    ) -> tuple[T, LedgerEntry]:
        """One charged release, the one way every kind takes: wait for the last release to
        settle, pre-check the charge against the target's own ledger, ``ask`` the source (with
        the ledger head and length it must match), translate a gRPC refusal, and verify the
        entry that came back (payload digest, signature, request, event; the charge check and
        countersignature follow in the background). ``ask`` reads and checks the payload."""
        self.settle()
        mine, known = self.ledger_sync.precheck(str(rid), event)
        try:
            answer = ask(head_hash(mine), len(mine))
        except grpc.RpcError as exc:
            raise translate(exc) from None
        entry = LedgerEntry.from_json(answer.entry_json)
        catch_up = [LedgerEntry.from_json(t) for t in answer.catch_up_json]
        self.ledger_sync.verify_entry(
            entry, answer.digest, answer.claimed, str(rid), event, known, more, catch_up,
            projection, scaling,
        )  # fmt: skip
        return answer.payload, entry

    def _release(self, session_id: str, index: int) -> BatchRelease:
        terms, info = self._sessions[session_id]
        if not (0 <= index < info.plan.releases):
            raise InvalidInput("batch index out of range")

        def ask(head: str, length: int) -> _Answer[_Batch]:
            req = pb.ReleaseBatchesRequest(
                session_id=session_id, start=index, count=1, ledger_head=head, ledger_length=length
            )
            msgs = list(self.stub.ReleaseBatches(req, timeout=self.cfg.timeout_s))
            if len(msgs) != 1:
                raise PeerMisbehaved("the source sent the wrong number of batches")
            return self._read_batch(msgs[0], terms, info, index)

        (z, counts, spec, stats), entry = self._ask_verified(
            RequestId.batch(session_id, index),
            info.plan.charged_event(terms, index),
            ask,
            more=index + 1 < info.plan.releases,
            projection=info.projection,
            scaling=self._scalings.get(info.session_id),
        )
        return BatchRelease(index, z, counts, spec, entry.seq, stats)

    def query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray:
        """PATE: labels for ``queries``, verified and countersigned like any release."""
        return self._synced(self._query_teachers, session_id, index, queries)

    def _query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray:
        terms, info = self._sessions[session_id]
        if info.plan.pate_scale is None:
            raise InvalidInput("PATE is not part of this session's terms")

        def ask(head: str, length: int) -> _Answer[np.ndarray]:
            req = pb.QueryTeachersRequest(
                session_id=session_id,
                index=index,
                queries=serde.to_pb(queries),
                ledger_head=head,
                ledger_length=length,
            )
            resp = self.stub.QueryTeachers(req, timeout=self.cfg.timeout_s)
            labels = serde.from_pb(resp.labels, dtype="<i8", ndim=1, shape=(queries.shape[0],))
            if labels.min(initial=0) < 0 or labels.max(initial=0) >= info.n_classes:
                raise PeerMisbehaved("labels out of range")
            return _Answer.of(labels, resp, payload_digest(resp.labels.data))

        event = answers_event(terms.pate_aggregator, info.plan.pate_scale, queries.shape[0])
        labels, _ = self._ask_verified(RequestId.pate(session_id, index), event, ask)
        return labels

    def _read_batch(
        self, msg: pb.BatchRelease, terms: SessionTerms, info: SessionInfo, index: int
    ) -> _Answer[_Batch]:
        """A batch's payload read and checked against the session's plan (shapes follow from
        the terms and the noisy counts; nothing sized by the source alone)."""
        spec = info.plan.release_spec(terms, index)
        ell = info.projection.shape[1]
        width = 2 * ell if terms.release == "class-gaussians" else ell
        groups = info.n_classes * terms.cells  # per (class, cell); cells is 1 but for prototypes
        rows = None if terms.release == "rows" else groups
        metric = isinstance(spec, MetricSpec)
        n_counts = 0 if metric else groups
        counts = _sized(msg.noisy_counts, "<i8", (n_counts,), "noisy_counts")
        if metric:  # the learned W: d′ × ℓ, nothing else
            rows, width = terms.metric_rows, ell
        elif terms.release == "sinkhorn-synthetic":  # its size follows from the noisy counts
            rows = int(
                points_per_class(
                    counts, terms.synthetic_points, terms.synthetic_rows_per_point
                ).sum()
            )
        z = _sized(msg.z, "<f8", (rows, width), "z")
        stats, stats_bytes = self._statistics(msg, terms, info, index)
        digest = payload_digest(msg.z.data, msg.noisy_counts.data, stats_bytes)
        if int(msg.index) != index:
            raise PeerMisbehaved("ledger entry is for another request")
        return _Answer.of((z, counts, spec, stats), msg, digest)

    @staticmethod
    def _statistics(
        msg: pb.BatchRelease, terms: SessionTerms, info: SessionInfo, index: int
    ) -> tuple[tuple[np.ndarray, np.ndarray, float] | None, bytes]:
        """The DP standardization a session's first release carries (loc, scale, C), checked:
        present exactly when the plan charges it, one finite location and one finite positive
        scale per source column and a finite C > 0; and its wire bytes (the payload digest
        covers them)."""
        want = index == 0 and info.plan.preprocessing_spec(terms) is not None
        if not msg.HasField("standardization"):
            if want:
                raise PeerMisbehaved("the first release lacks the source's standardization")
            return None, b""
        if not want:
            raise PeerMisbehaved("a release carries a standardization the plan does not charge")
        k = info.plan.preprocessing_columns
        v = serde.from_pb(msg.standardization, dtype="<f8", ndim=1, shape=(2 * k + 1,))
        loc, scale, c = v[:k].copy(), v[k : 2 * k].copy(), float(v[-1])
        if not (np.isfinite(v).all() and (scale > 0).all() and c > 0):
            raise PeerMisbehaved("the source's standardization is not finite and positive")
        return (loc, scale, c), msg.standardization.data

    # ---------------------------------------------------- reweighting (the public-source setting)
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
            raise translate(exc) from None
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
        def ask(head: str, length: int) -> _Answer[np.ndarray]:
            req = pb.ReweightStepsRequest(
                session_id=info.session_id,
                start=start,
                count=count,
                ledger_head=head,
                ledger_length=length,
            )
            resp = self.stub.ReweightSteps(req, timeout=self.cfg.timeout_s)
            if info.plan.method == "noisy-md":
                shape = (count, info.n_public)
                out = serde.from_pb(resp.gradients, dtype="<f8", ndim=2, shape=shape)
                return _Answer.of(out, resp, payload_digest(resp.gradients.data))
            out = serde.from_pb(resp.vertices, dtype="<i8", ndim=1, shape=(count,))
            if out.min() < 0 or out.max() >= info.n_public:
                raise PeerMisbehaved("a selected row is out of range")
            return _Answer.of(out, resp, payload_digest(resp.vertices.data))

        out, _ = self._ask_verified(
            RequestId.reweight(info.session_id, start),
            info.plan.event(count),
            ask,
            more=start + count < info.plan.steps,
        )
        return out


def _sized(arr: pb.NDArray, dtype: str, shape: tuple[int | None, ...], field: str) -> np.ndarray:
    """A release's array in the shape the session's terms make (q × cells class sums and
    counts, a synthetic point per …): any other shape or dtype is the source misbehaving."""
    try:
        return serde.from_pb(arr, dtype=dtype, ndim=len(shape), shape=shape)
    except InvalidInput:
        raise PeerMisbehaved(
            f"the source's release: {field} is not the {dtype} array of shape "
            f"{tuple('any' if d is None else d for d in shape)} the session's terms make"
        ) from None
