"""The source's release logic (no gRPC): sessions, projection, noisy label-sorted batches.

Order of operations for every batch (docs/architecture.md, "A release's path"): build the spec
from public parameters →
the ledger checks every cap and durably appends the entry → only then draw the sample and the
noise → the payload hash goes into the entry. Nothing leaves but the mechanism's output: the
noisy rows (sorted by label, shuffled within each class) and the noisy counts.

The mechanisms of a batch are ``batch_draws``; the features they read, ``features``; PATE
answers on a session, ``pate_answers``.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling, per_row
from dpda.dp.events import MetricSpec, event_from_json
from dpda.dp.ledger import LedgerEntry, PrivacyLedger, spend_of
from dpda.dp.mechanisms import (
    check_projection,
    jl_matrix,
)
from dpda.dp.rng import is_cryptographic, public_rng, secure_rng
from dpda.dp.work_bounds import CalibrationTimeout, PlanTooLarge, time_limit
from dpda.errors import BudgetExceeded, InvalidInput, PolicyRefused
from dpda.planner import PlanRefused, ReleasePlan, plan_batches
from dpda.policy import (
    PrivacyPolicy,
    check_plan,
    check_terms,
    check_work,
)
from dpda.protocol import (
    BatchRelease,
    RequestId,
    SessionInfo,
    TargetDisclosure,
    array_digest,
)
from dpda.source_party.batch_draws import draw_metric, draw_rows
from dpda.source_party.features import check_scaling, scaled_features
from dpda.source_party.pate_answers import PateAnswers
from dpda.source_party.preprocessing import SessionPreprocessing
from dpda.terms import SessionTerms


@dataclass(frozen=True)
class PreparedSession:
    """A session checked and planned, not yet live: what ``SourceReleaser.install`` needs."""

    terms: SessionTerms
    scaling: Scaling | None
    projection: np.ndarray
    plan: ReleasePlan
    bound: dict[str, Any]  # what its charges depend on (recorded in every entry)


@dataclass
class LiveSession:
    """A session the releaser serves: its terms and facts, the target's scaling, what its
    charges depend on (recorded in every entry) and its own noise stream."""

    terms: SessionTerms
    info: SessionInfo
    scaling: Scaling | None
    bound: dict[str, Any]
    noise: np.random.Generator


# distinct target scalings whose prepared features are kept (each is one n × k float64 copy)
FEATURE_CACHE = 4


class SourceReleaser(SessionPreprocessing):
    """One source dataset behind the ledger and its privacy policy. Used in-process and by the
    gRPC handlers.

    ``rng`` draws the privacy noise (a CSPRNG generator in the daemon); public randomness (JL
    matrices) comes from ``public`` (a separate generator), never from the noise stream.
    ``insecure_seed`` marks a releaser whose noise was seeded for testing: every ledger entry it
    writes says so.
    """

    def __init__(
        self,
        domain: Domain,
        dataset: str,
        ledger: PrivacyLedger,
        rng: np.random.Generator,
        representation: str = "raw",
        allow_raw_queries: bool = False,
        policy: PrivacyPolicy | None = None,
        public: np.random.Generator | None = None,
        insecure_seed: bool = False,
    ) -> None:
        self.allow_raw_queries = allow_raw_queries
        self._init_preprocessing()
        self.domain = domain
        self.dataset = dataset
        self.ledger = ledger
        self.rng = rng
        self.public = public if public is not None else public_rng()
        self.representation = representation
        self.policy = policy if policy is not None else PrivacyPolicy()
        self.insecure_seed = insecure_seed
        self._sessions: dict[str, LiveSession] = {}
        self._features: dict[str, np.ndarray] = {}  # scaling digest → prepared features (LRU)
        self._rows: np.ndarray | None = None  # the per-row representation (``rows``)
        self._feat_lock = threading.Lock()
        self._rows_lock = threading.Lock()
        self.pate = PateAnswers(self)

    def open_session(
        self, terms: SessionTerms, disclosure: TargetDisclosure, session_id: str | None = None
    ) -> SessionInfo:
        """Check, plan and install a session (``prepare`` then ``install``)."""
        return self.install(self.prepare(terms, disclosure), session_id or uuid.uuid4().hex)

    def prepare(
        self,
        terms: SessionTerms,
        disclosure: TargetDisclosure,
        projection: np.ndarray | None = None,
        plan_seconds: float | None = None,
    ) -> PreparedSession:
        """Check the terms against the policy and the target's inputs against their bounds and
        compute the plan and its floors: all before anything is charged or drawn, and with no
        side effect (the daemon runs this outside its lock, under a time limit). ``projection``
        restores a stored session's matrix instead of drawing a new one."""
        if terms.dataset != self.dataset:
            raise InvalidInput("unknown dataset", public=True)
        if self.domain.y is None:
            raise PolicyRefused("this dataset has no labels: it serves reweighting sessions only")
        budget = self.ledger.budgets.get(self.dataset)
        if budget is None or terms.delta != budget.delta:
            raise PolicyRefused(
                "delta differs from the dataset's delta"
                + ("" if budget is None else f" ({budget.delta:.6g})")
            )
        check_terms(self.policy, terms, allow_raw_queries=self.allow_raw_queries)
        k = self.domain.x.shape[1]
        n = self.domain.x.shape[0]
        check_work(self.policy, terms, n, self.domain.n_classes)
        if terms.pate_queries > 0 and terms.pate_teachers > n:
            raise PolicyRefused(f"pate_teachers {terms.pate_teachers} exceeds the {n} records")
        check_scaling(disclosure.scaling, k)
        if terms.source_space and (disclosure.scaling is not None or disclosure.basis is not None):
            raise InvalidInput(
                "projection 'source': the release is computed in the source's own space and "
                "takes no scaling or basis from the target (send none)",
                public=True,
            )
        if projection is not None:
            m = projection
        elif terms.source_space:
            m = np.eye(k)  # the source's own per-row space, every feature
        elif terms.projection == "target-pca":
            if disclosure.basis is None:
                raise InvalidInput("target-pca needs the target's basis", public=True)
            basis = np.asarray(disclosure.basis, dtype=np.float64)
            try:
                check_projection(basis, k, orthonormal=True)
            except ValueError as exc:  # check_projection's fixed texts, and public shapes
                raise InvalidInput(
                    f"basis of shape {basis.shape} for a source with {k} features: {exc}",
                    public=True,
                ) from None
            if basis.shape[1] != terms.projection_dim:
                raise InvalidInput(
                    f"basis: {basis.shape[1]} columns, projection_dim {terms.projection_dim}",
                    public=True,
                )
            m = basis
        else:
            if terms.projection_dim > k:
                raise InvalidInput(
                    f"projection_dim {terms.projection_dim} exceeds the source's {k} features",
                    public=True,
                )
            m = jl_matrix(k, terms.projection_dim, self.public)
        std = None if disclosure.scaling is None else disclosure.scaling.std
        try:
            with time_limit(plan_seconds):
                plan = plan_batches(
                    terms, n, m, attribute_bound=self.policy.attribute_bound, scaling_std=std
                )
        except CalibrationTimeout:
            raise PolicyRefused(
                f"the release plan takes longer than {plan_seconds:g} s to compute: ask for "
                "fewer steps or queries, or a larger batch"
            ) from None
        except PlanTooLarge:
            raise PolicyRefused(
                "the release plan needs a privacy-loss distribution larger than the source "
                "computes for a plan: ask for fewer steps, a smaller batch or more noise"
            ) from None
        except PlanRefused as exc:
            raise PolicyRefused(str(exc)) from None
        except (ValueError, ArithmeticError, RuntimeWarning):  # a library's text is not public
            raise InvalidInput("no release plan can be computed for these terms") from None
        check_plan(self.policy, plan, terms)
        if plan.metric_noise_multiplier is not None:
            # the metric takes a share of the Gaussian part's μ², which leaves the exact ε
            # unchanged; the ledger composes the feature event and the metric's separately
            # (more pessimistically at small ε): refused here rather than half-way, after W
            charged = spend_of(plan.events(terms), terms.delta)
            if charged > terms.epsilon * (1 + 1e-9):
                raise PolicyRefused(
                    f"metric_share: with the metric the session's releases compose to ε "
                    f"{charged:.6g} in the ledger, above its ε {terms.epsilon:g} (ask for a "
                    "larger ε or no metric)"
                )
        bound = {
            "sensitivity": plan.feature_sensitivity,
            "attribute_bound": plan.attribute_bound,
            "projection_sha256": array_digest(m),
            "scaling_mean_sha256": array_digest(
                None if disclosure.scaling is None else disclosure.scaling.mean
            ),
            "scaling_std_sha256": array_digest(std),
            **({"insecure_seed": True} if self.insecure_seed else {}),
            # the √2·C bound rests on the clamp the source applies to every row
            **({"nonnegative_rows": True} if terms.nonnegative_rows else {}),
        }
        return PreparedSession(terms, disclosure.scaling, m, plan, bound)

    def install(self, prepared: PreparedSession, sid: str) -> SessionInfo:
        """Make a prepared session live. The features are prepared lazily, on the first draw,
        and shared by every session with the same scaling (``_features``)."""
        k = self.domain.x.shape[1]
        n = self.domain.x.shape[0]
        info = SessionInfo(sid, n, k, self.domain.n_classes, prepared.projection, prepared.plan)
        # a fresh CSPRNG stream per session; a seeded (testing) releaser keeps its one stream
        noise = secure_rng() if is_cryptographic(self.rng) else self.rng
        self._sessions[sid] = LiveSession(
            prepared.terms, info, prepared.scaling, prepared.bound, noise
        )
        return info

    def rows(self) -> np.ndarray:
        """The dataset in its per-row representation: needs nothing from any target, so it is
        computed once (read-only) and shared by every scaling; the daemon computes it when it
        starts."""
        with self._rows_lock:
            if self._rows is None:
                x = self.domain.x
                r = np.asarray(x, np.float64) if self.representation == "raw" else None
                r = (per_row(x, self.representation) if r is None else r).view()
                r.setflags(write=False)
                self._rows = r
            return self._rows

    def features(self, session_id: str) -> np.ndarray:
        """The session's prepared features (per-row map, the target's scaling, clamp): one
        read-only copy per distinct scaling, at most ``FEATURE_CACHE`` of them kept, computed
        outside the cache's lock (a session with another scaling does not wait for it)."""
        own = self.standardized_rows(session_id)
        if own is not None:  # the session's DP standardization (one array per session)
            return own
        scaling = self.live(session_id).scaling
        key = "" if scaling is None else array_digest(scaling.mean) + array_digest(scaling.std)
        with self._feat_lock:
            x = self._features.pop(key, None)
            if x is not None:
                self._features[key] = x  # most recently used last
                return x
        x = scaled_features(self.rows(), scaling)
        x.setflags(write=False)
        with self._feat_lock:
            x = self._features.pop(key, x)  # another thread's copy, if it was first
            self._features[key] = x
            while len(self._features) > FEATURE_CACHE:
                self._features.pop(next(iter(self._features)))
        return x

    def warm_charge(
        self,
        session_id: str,
        extra_caps: Sequence[tuple[str, float, Sequence[Any]]] = (),
        index: int = 0,
    ) -> None:
        """The ε of release ``index``'s charge on the dataset, the session and ``extra_caps``,
        composed ahead into the accountant's cache, as ``release`` will check them. Nothing is
        charged, drawn or written: the release still checks and charges for itself and finds
        the composition cached. The daemon runs this after ``OpenSession`` for the first
        release, and after each release for the next, while the target fits the last one
        (a cold composition's time otherwise sits inside the release, under the handlers'
        lock: docs/results.md, "Service overhead"). The features are not prepared ahead: a session
        costs no memory until a release needs it."""
        terms, info = self.session(session_id)
        if not (0 <= index < info.plan.releases):
            return
        event = info.plan.charged_event(terms, index)
        prior = [
            event_from_json(e.dp_event)
            for e in self.ledger.store.entries(self.dataset)
            if e.session == session_id
        ]
        try:
            self.ledger.check(
                self.dataset, [event], [("session", terms.epsilon, prior), *extra_caps]
            )
        except BudgetExceeded:
            pass  # the release will say so, with the numbers

    def warm_plan(
        self,
        terms: SessionTerms,
        extra_caps: Sequence[tuple[str, float, Sequence[Any]]] = (),
        plan_seconds: float | None = None,
    ) -> None:
        """The plan of ``terms`` and the charge of their first release on a new session,
        composed ahead into the accountant's caches, before any session exists: what a peer's
        ``DescribeDataset`` with planned terms asks for while it computes its basis. The same
        checks and time limit as ``prepare``; an identity basis and no scaling stand in for the
        target's (a release's event depends on the terms and the dataset's size, not on the
        projection, the scaling or the clip norm: only its sensitivity does). Nothing is stored,
        charged, drawn or prepared: ``OpenSession`` checks and plans its own terms again and
        finds the work cached. Refused terms raise as ``prepare`` would; the shape checks of a
        basis the hint does not carry are ``OpenSession``'s. The stand-in is one column wide
        (the event does not depend on the width either), so a hint allocates nothing of the
        basis's size; the composition runs under the same time limit as the plan."""
        k = self.domain.x.shape[1]
        if terms.projection != "target-pca" and terms.projection_dim > k:
            raise InvalidInput(
                f"projection_dim {terms.projection_dim} exceeds the source's {k} features",
                public=True,
            )
        stand_in = np.eye(k, 1)
        with time_limit(plan_seconds):
            prepared = self.prepare(terms, TargetDisclosure(None), stand_in, plan_seconds)
            if prepared.plan.releases < 1:
                return
            event = prepared.plan.charged_event(terms, 0)
            caps = [("session", terms.epsilon, []), *extra_caps]
            try:
                self.ledger.check(self.dataset, [event], caps)
            except BudgetExceeded:
                pass  # OpenSession's release will say so, with the numbers

    def live(self, session_id: str) -> LiveSession:
        try:
            return self._sessions[session_id]
        except KeyError:
            raise InvalidInput("unknown or closed session") from None

    def session(self, session_id: str) -> tuple[SessionTerms, SessionInfo]:
        live = self.live(session_id)
        return live.terms, live.info

    def resident(self, session_id: str) -> bool:
        return session_id in self._sessions

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
        entry = self.charge(session_id, index, peer, extra_caps)
        return self.draw(session_id, index, entry)

    def charge(
        self,
        session_id: str,
        index: int,
        peer: str = "in-process",
        extra_caps: Sequence[tuple[str, float, Sequence[Any]]] = (),
    ) -> LedgerEntry:
        """Charge batch ``index`` of a session (``release``'s first half): the entry, durable,
        before anything is drawn."""
        terms, info = self.session(session_id)
        if not (0 <= index < info.plan.releases):
            raise InvalidInput("batch index out of range")
        spec = info.plan.release_spec(terms, index)
        pre = info.plan.preprocessing_spec(terms)
        if pre is not None and index > 0 and self.first_entry(session_id) is None:
            raise InvalidInput(
                "the session's first release (it charges the preprocessing) comes first"
            )
        prior = [
            event_from_json(e.dp_event)
            for e in self.ledger.store.entries(self.dataset)
            if e.session == session_id
        ]
        entry = self.ledger.charge(
            dataset=self.dataset,
            events=info.plan.charged_events(terms, index),
            session=session_id,
            peer=peer,
            request_id=str(RequestId.batch(session_id, index)),
            privacy_unit=terms.privacy_unit,
            neighbouring=terms.neighbouring,
            params={
                "batch": index,
                "spec": spec.to_json(),
                **({"preprocessing": pre.to_json()} if pre is not None and index == 0 else {}),
                "delta": self.ledger.budgets[self.dataset].delta,
                **self.live(session_id).bound,
            },
            extra_caps=[("session", terms.epsilon, prior), *extra_caps],
        )
        return entry

    def draw(self, session_id: str, index: int, entry: LedgerEntry) -> BatchRelease:
        """Sample and add noise for an entry that is already durably in the ledger, and record
        the payload's hash in it."""
        rel = self.draw_payload(session_id, index, entry)
        self.record_payload(entry.seq, rel)
        return rel

    def record_payload(self, seq: int, rel: BatchRelease) -> None:
        """The payload's hash into its ledger entry (before the entry is signed)."""
        self.ledger.store.update_signatures(self.dataset, seq, rel.sha256(), "", "")

    def draws_unlocked(self, session_id: str, index: int) -> bool:
        """Whether release ``index`` is work the peer's terms size, drawn outside the daemon's
        lock: the learned ground cost (trained for ``metric_steps``) and DP-Sinkhorn synthetic
        points (trained for the terms' steps). Charged and stored under the lock all the same."""
        terms, info = self.session(session_id)
        return info.plan.is_metric(index) or terms.release == "sinkhorn-synthetic"

    def draw_payload(self, session_id: str, index: int, entry: LedgerEntry) -> BatchRelease:
        """The release of a charged entry, drawn; nothing written (a caller that draws outside
        the ledger's lock records the hash under it, ``record_payload``)."""
        terms, info = self.session(session_id)
        x = self.features(session_id)
        spec = info.plan.release_spec(terms, index)
        y, rng = self.domain.labels(), self.live(session_id).noise
        if isinstance(spec, MetricSpec):
            rel = draw_metric(x, y, terms, spec, info, index, entry, rng)
        else:
            rel = draw_rows(x, y, terms, spec, info, index, entry, rng)
        return self.with_statistics(session_id, rel)

    def close_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self.pate.close(session_id)
        self._close_preprocessing(session_id)

    def query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray:
        """The ``ReleaseSource`` view of PATE (``PateAnswers.answer``): only the labels."""
        return self.pate.answer(session_id, index, queries).labels
