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
from typing import Literal, Protocol

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


ReleaseKindName = Literal["batch", "pate", "reweight"]
# the kinds whose printed id carries their name ("<session>/<kind>/<index>"); a batch's has
# none ("<session>/<index>")
_NAMED_KINDS: tuple[ReleaseKindName, ...] = ("pate", "reweight")


@dataclass(frozen=True)
class RequestId:
    """The identity of one release: its kind, its session and its index in the session.

    Both parties' ledgers key a release by its printed form (``str(rid)``): ``<session>/<index>``
    for a batch, ``<session>/pate/<index>`` for a PATE answer, ``<session>/reweight/<start>``
    for a block of reweighting steps. A retried request names the same id, which is what
    replays a stored release instead of drawing it again; ``parse`` reads the printed form
    back, and is the only reader of it.
    """

    kind: ReleaseKindName
    session: str
    index: int

    def __str__(self) -> str:
        if self.kind == "batch":
            return f"{self.session}/{self.index}"
        return f"{self.session}/{self.kind}/{self.index}"

    @classmethod
    def batch(cls, session: str, index: int) -> RequestId:
        return cls("batch", session, index)

    @classmethod
    def pate(cls, session: str, index: int) -> RequestId:
        return cls("pate", session, index)

    @classmethod
    def reweight(cls, session: str, start: int) -> RequestId:
        return cls("reweight", session, start)

    @classmethod
    def parse(cls, text: str) -> RequestId | None:
        """The id a ledger's ``request_id`` prints, or None for one that names no release of a
        session (the target's own-rows entries, a refusal's code)."""
        head, _, last = text.rpartition("/")
        if not head or not last.isdecimal():
            return None
        session, _, word = head.rpartition("/")
        if not session:
            return cls("batch", head, int(last))
        kind = next((k for k in _NAMED_KINDS if k == word), None)
        return cls(kind, session, int(last)) if kind and "/" not in session else None


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
