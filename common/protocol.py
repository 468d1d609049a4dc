"""What the two parties share about a session and its releases, and nothing else: the session
facts the source returns, the target's disclosure, the released payloads and their digests, and
the ``ReleaseSource`` seam the target's job runs against (the gRPC client, or the source's
releaser in-process). Both parties import this module; neither imports the other.

The signed bytes of a payload are defined here once (``payload_bytes``, ``payload_digest``): the
source hashes what it stores and sends, the target hashes what it received.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from dpda.data.preprocessing import Scaling
from dpda.dp.events import BatchSpec, MetricSpec
from dpda.planner import ReleasePlan
from dpda.public_source_terms import ReweightingPlan
from dpda.terms import SessionTerms


def payload_digest(*parts: bytes) -> str:
    """SHA-256 of a payload's wire bytes, concatenated in order (the ledger entry records it)."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part)
    return h.hexdigest()


def array_digest(a: np.ndarray | None) -> str:
    """SHA-256 of an array as float64 little-endian (``""`` for None): binds a ledger entry to
    the projection and scaling its sensitivity was computed from (both parties compute it)."""
    if a is None:
        return ""
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<f8").tobytes()).hexdigest()


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
    spec: BatchSpec | MetricSpec  # MetricSpec: z is the learned W (d′ × ℓ), no counts
    ledger_seq: int
    # preprocessing = standardize, the session's first release: the source's DP statistics
    # the session's releases are computed with (loc, scale, C), charged in this release's
    # entry together with it; its payload digest covers them
    standardization: tuple[np.ndarray, np.ndarray, float] | None = None

    def statistics_vector(self) -> np.ndarray | None:
        """The statistics as they travel: one (2k + 1,) float64 vector loc, scale, C."""
        if self.standardization is None:
            return None
        loc, scale, c = self.standardization
        return np.concatenate([loc, scale, [c]]).astype("<f8")

    def payload_bytes(self) -> bytes:
        stats = self.statistics_vector()
        return (
            np.ascontiguousarray(self.z, dtype="<f8").tobytes()
            + np.ascontiguousarray(self.noisy_counts, dtype="<i8").tobytes()
            + (b"" if stats is None else stats.tobytes())
        )

    def sha256(self) -> str:
        return payload_digest(self.payload_bytes())


@dataclass(frozen=True)
class ReweightingInfo:
    """An open reweighting session (the public-source deployment), as the driving party holds it."""

    session_id: str
    n_rows: int  # the holder's row count (public: DescribeDataset gives it too)
    plan: ReweightingPlan
    n_public: int  # the driver's public rows the weights are over


@dataclass(frozen=True)
class PateAnswer:
    labels: np.ndarray  # (n,) int64: the noisy arg-max, nothing else
    ledger_seq: int

    def payload_bytes(self) -> bytes:
        return np.ascontiguousarray(self.labels, dtype="<i8").tobytes()

    def sha256(self) -> str:
        return payload_digest(self.payload_bytes())


def queries_digest(queries: np.ndarray) -> str:
    """SHA-256 of the queries as sent (little-endian float64): binds a request id to its content."""
    return hashlib.sha256(np.ascontiguousarray(queries, dtype="<f8").tobytes()).hexdigest()


class ReleaseSource(Protocol):
    """Where the target's job gets its releases: the verifying gRPC client
    (``dpda.target_party.client.GrpcReleaseSource``) or the in-process releaser."""

    def open_session(
        self, terms: SessionTerms, disclosure: TargetDisclosure, session_id: str | None = None
    ) -> SessionInfo: ...
    def release(self, session_id: str, index: int, peer: str = ...) -> BatchRelease: ...
    def query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray: ...
    def close_session(self, session_id: str) -> None: ...
