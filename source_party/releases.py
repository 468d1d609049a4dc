"""The source's release logic (no gRPC): sessions, projection, noisy label-sorted batches.

Order of operations for every batch (DESIGN.md §3): build the spec from public parameters →
the ledger checks every cap and durably appends the entry → only then draw the sample and the
noise → the payload hash goes into the entry. Nothing leaves but the mechanism's output: the
noisy rows (sorted by label, shuffled within each class) and the noisy counts.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from common.data.loaders import Domain
from common.data.preprocessing import Scaling, per_row
from common.dp.events import BatchSpec, event_from_json
from common.dp.ledger import LedgerEntry, PrivacyLedger
from common.dp.mechanisms import (
    check_projection,
    clip_rows,
    discrete_laplace_noise,
    gaussian_noise,
    jl_matrix,
    label_counts,
)
from common.errors import InvalidInput
from common.terms import ReleasePlan, SessionTerms, plan_batches


@dataclass(frozen=True)
class TargetDisclosure:
    """What the target discloses about its own data when it opens a session (it logs it)."""

    scaling: Scaling | None = None  # column mean/std in the shared representation
    basis: np.ndarray | None = None  # (k, ℓ) orthonormal, for projection = target-pca


@dataclass(frozen=True)
class SessionInfo:
    session_id: str
    n_rows: int  # public metadata
    n_features: int
    n_classes: int
    projection: np.ndarray  # M (k, ℓ)
    plan: ReleasePlan


@dataclass(frozen=True)
class BatchRelease:
    index: int
    z: np.ndarray  # (n_b, ℓ) noisy projected rows, label-sorted blocks
    noisy_counts: np.ndarray  # (q,) int64
    spec: BatchSpec
    ledger_seq: int

    def payload_bytes(self) -> bytes:
        return (
            np.ascontiguousarray(self.z, dtype="<f8").tobytes()
            + np.ascontiguousarray(self.noisy_counts, dtype="<i8").tobytes()
        )

    def sha256(self) -> str:
        return hashlib.sha256(self.payload_bytes()).hexdigest()


def prepare_features(
    x_raw: np.ndarray, representation: str, terms: SessionTerms, scaling: Scaling | None
) -> np.ndarray:
    """Per-row transform, the target's public scaling, and record-unit clipping (all DP-clean)."""
    x = per_row(x_raw, representation)
    if scaling is not None:
        if scaling.mean.shape != (x.shape[1],) or scaling.std.shape != (x.shape[1],):
            raise InvalidInput("scaling has the wrong shape")
        if not (np.all(np.isfinite(scaling.mean)) and np.all(scaling.std > 0)):
            raise InvalidInput("scaling must be finite with positive std")
        x = scaling.apply(x)
    if terms.privacy_unit == "record":
        x = clip_rows(x, terms.clip_norm)
    return x


class SourceReleaser:
    """One source dataset behind the ledger. Used in-process and by the gRPC handlers."""

    def __init__(
        self,
        domain: Domain,
        dataset: str,
        ledger: PrivacyLedger,
        rng: np.random.Generator,
        representation: str = "raw",
    ) -> None:
        self.domain = domain
        self.dataset = dataset
        self.ledger = ledger
        self.rng = rng
        self.representation = representation
        self._sessions: dict[str, tuple[SessionTerms, SessionInfo, np.ndarray]] = {}

    def open_session(
        self, terms: SessionTerms, disclosure: TargetDisclosure, session_id: str | None = None
    ) -> SessionInfo:
        if terms.dataset != self.dataset:
            raise InvalidInput("unknown dataset")
        budget = self.ledger.budgets.get(self.dataset)
        if budget is None or terms.delta != budget.delta:
            raise InvalidInput("terms.delta differs from the dataset's delta")
        k = self.domain.x.shape[1]
        if terms.projection == "target-pca":
            if disclosure.basis is None:
                raise InvalidInput("target-pca needs the target's basis")
            basis = np.asarray(disclosure.basis, dtype=np.float64)
            try:
                check_projection(basis, k, orthonormal=True)
            except ValueError as exc:
                raise InvalidInput(str(exc)) from None
            if basis.shape[1] != terms.projection_dim:
                raise InvalidInput("basis width differs from projection_dim")
            m = basis
        else:
            if terms.projection_dim > k:
                raise InvalidInput("projection_dim exceeds the number of features")
            m = jl_matrix(k, terms.projection_dim, self.rng)
        x = prepare_features(self.domain.x, self.representation, terms, disclosure.scaling)
        try:
            plan = plan_batches(terms, self.domain.x.shape[0], m)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        sid = session_id or uuid.uuid4().hex
        info = SessionInfo(sid, x.shape[0], k, self.domain.n_classes, m, plan)
        self._sessions[sid] = (terms, info, x)
        return info

    def session(self, session_id: str) -> tuple[SessionTerms, SessionInfo]:
        try:
            terms, info, _ = self._sessions[session_id]
        except KeyError:
            raise InvalidInput("unknown or closed session") from None
        return terms, info

    def restore_session(
        self,
        session_id: str,
        terms: SessionTerms,
        projection: np.ndarray,
        disclosure: TargetDisclosure,
    ) -> SessionInfo:
        """Rebuild a session after a restart from its stored terms, projection and disclosure."""
        x = prepare_features(self.domain.x, self.representation, terms, disclosure.scaling)
        plan = plan_batches(terms, self.domain.x.shape[0], projection)
        info = SessionInfo(
            session_id, x.shape[0], x.shape[1], self.domain.n_classes, projection, plan
        )
        self._sessions[session_id] = (terms, info, x)
        return info

    def release(
        self,
        session_id: str,
        index: int,
        peer: str = "in-process",
        extra_caps: Sequence[tuple[str, float, Sequence[Any]]] = (),
    ) -> BatchRelease:
        """Release batch ``index`` of a session: charge first, then sample and draw noise.

        The session's own budget (``terms.epsilon``) is always a cap, besides the dataset's and
        any ``extra_caps`` (per-peer caps of the daemon).
        """
        terms, info = self.session(session_id)
        if not (0 <= index < info.plan.steps):
            raise InvalidInput("batch index out of range")
        spec = info.plan.spec(terms)
        prior = [
            event_from_json(e.dp_event)
            for e in self.ledger.store.entries(self.dataset)
            if e.session == session_id
        ]
        entry = self.ledger.charge(
            dataset=self.dataset,
            events=[spec.dp_event()],
            session=session_id,
            peer=peer,
            request_id=f"{session_id}/{index}",
            privacy_unit=terms.privacy_unit,
            neighbouring=terms.neighbouring,
            params={
                "batch": index,
                "spec": spec.to_json(),
                "delta": self.ledger.budgets[self.dataset].delta,
            },
            extra_caps=[("session", terms.epsilon, prior), *extra_caps],
        )
        return self.draw(session_id, index, entry)

    def draw(self, session_id: str, index: int, entry: LedgerEntry) -> BatchRelease:
        """Sample and add noise for an entry that is already durably in the ledger."""
        terms, info = self.session(session_id)
        x = self._sessions[session_id][2]
        rel = self._draw(x, info.plan.spec(terms), info, index, entry)
        self.ledger.store.update_signatures(self.dataset, entry.seq, rel.sha256(), "", "")
        return rel

    def _draw(
        self, x: np.ndarray, spec: BatchSpec, info: SessionInfo, index: int, entry: LedgerEntry
    ) -> BatchRelease:
        y = self.domain.y
        if spec.sampling_rate is None:
            rows = np.arange(x.shape[0])
        else:
            rows = np.flatnonzero(self.rng.random(x.shape[0]) < spec.sampling_rate)
        # Label-sorted blocks, random order inside each class (no link to storage order).
        rows = rows[self.rng.permutation(rows.size)]
        rows = rows[np.argsort(y[rows], kind="stable")]
        proj = x[rows] @ info.projection
        z = proj + gaussian_noise(proj.shape, spec.features.noise_std, self.rng)
        counts = label_counts(y[rows], info.n_classes)
        h = spec.histogram
        if h.mechanism == "discrete_laplace":
            noisy = counts + discrete_laplace_noise(counts.shape, h.parameter, self.rng)
        else:
            noise = gaussian_noise(counts.shape, h.noise_std, self.rng)
            noisy = np.rint(counts + noise).astype(np.int64)
        return BatchRelease(index, z, noisy, spec, entry.seq)

    def close_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)

    def batches(self, session_id: str) -> Iterator[BatchRelease]:
        info = self._sessions[session_id][1]
        for i in range(info.plan.steps):
            yield self.release(session_id, i)
