"""The source's release logic (no gRPC): sessions, projection, noisy label-sorted batches.

Order of operations for every batch (DESIGN.md §3): build the spec from public parameters →
the ledger checks every cap and durably appends the entry → only then draw the sample and the
noise → the payload hash goes into the entry. Nothing leaves but the mechanism's output: the
noisy rows (sorted by label, shuffled within each class) and the noisy counts.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import mmap
import threading
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling, per_row
from dpda.dp.events import BatchSpec, MetricSpec, event_from_json
from dpda.dp.ledger import LedgerEntry, PrivacyLedger, spend_of
from dpda.dp.mechanisms import (
    check_projection,
    class_sums,
    clip_rows,
    discrete_laplace_noise,
    finite_rows,
    gaussian_noise,
    jl_matrix,
    label_counts,
)
from dpda.dp.metric import train_metric
from dpda.dp.pate import answers_event, noisy_argmax
from dpda.dp.rng import is_cryptographic, public_rng, secure_rng
from dpda.dp.sinkhorn_synthetic import train_synthetic
from dpda.dp.work_bounds import CalibrationTimeout, PlanTooLarge, time_limit
from dpda.errors import BudgetExceeded, InvalidInput, PolicyRefused
from dpda.policy import (
    SCALING_MEAN_MAX,
    SCALING_STD_RANGE,
    PrivacyPolicy,
    check_plan,
    check_terms,
    check_work,
)
from dpda.protocol import (
    BatchRelease,
    PateAnswer,
    SessionInfo,
    TargetDisclosure,
    array_digest,
    queries_digest,
)
from dpda.source_party.teachers import TeacherEnsemble
from dpda.terms import (
    PlanRefused,
    ReleasePlan,
    SessionTerms,
    metric_params,
    plan_batches,
    synthetic_params,
)


@dataclass(frozen=True)
class PreparedSession:
    """A session checked and planned, not yet live: what ``SourceReleaser.install`` needs."""

    terms: SessionTerms
    scaling: Scaling | None
    projection: np.ndarray
    plan: ReleasePlan
    bound: dict[str, Any]  # what its charges depend on (recorded in every entry)


# Values of the scaled per-row representation are clamped to this magnitude: an elementwise
# clamp is 1-Lipschitz per coordinate (so no sensitivity grows) and keeps every later product
# finite (ℓ, k ≤ 1e5 and |M| ≤ ~1 give |x·M| ≤ ~1e106).
CLAMP = 1e100

# distinct target scalings whose prepared features are kept (each is one n × k float64 copy)
FEATURE_CACHE = 4
POPULATE_MIN_BYTES = 1 << 20  # below this, first-touch faults cost less than a mapping
# above this, np.empty: the mapping call holds the GIL while the kernel maps every page (256 MiB
# stalled the daemon's other threads for 62–75 ms, found by review); numpy's loop faults pages
# in with the GIL released
POPULATE_MAX_BYTES = 32 << 20


def check_scaling(scaling: Scaling | None, n_features: int) -> None:
    """The target's column scaling is an input to the mechanism: bounded, or refused."""
    if scaling is None:
        return
    if scaling.mean.shape != (n_features,) or scaling.std.shape != (n_features,):
        raise InvalidInput(
            f"scaling: {scaling.mean.shape[0]} and {scaling.std.shape[0]} columns, the source "
            f"has {n_features} features",
            public=True,
        )
    lo, hi = SCALING_STD_RANGE
    if not (np.all(np.isfinite(scaling.mean)) and np.all(np.abs(scaling.mean) <= SCALING_MEAN_MAX)):
        raise PolicyRefused(
            f"scaling_mean: every entry must be finite with |mean| ≤ {SCALING_MEAN_MAX:g}"
        )
    if not (np.all(np.isfinite(scaling.std)) and np.all((scaling.std >= lo) & (scaling.std <= hi))):
        raise PolicyRefused(f"scaling_std: every entry must lie in [{lo:g}, {hi:g}]")


def prepare_features(x_raw: np.ndarray, representation: str, scaling: Scaling | None) -> np.ndarray:
    """Per-row transform, then the target's public scaling, clamped to ±CLAMP (all DP-clean:
    per-row or elementwise maps with public parameters). Clipping (record unit) happens after
    the projection, on finite rows (``mechanisms.clip_rows``)."""
    return scaled_features(per_row(x_raw, representation), scaling)


def populated_empty(shape: tuple[int, ...], dtype: np.dtype[Any] | type) -> np.ndarray:
    """``np.empty(shape, dtype)`` whose pages the kernel maps in one call (``MAP_POPULATE``)
    rather than one fault per 4 KiB page at first touch. In a daemon a large array is fresh
    memory (a worker thread's first allocation of its size): on this project's 2-core VM the
    Office-Caltech features (7 MiB) took 1,839 page faults and 17 ms to compute against 4 ms
    from memory the allocator had already mapped (``dpda bench service`` traces). Arrays under
    ``POPULATE_MIN_BYTES`` or over ``POPULATE_MAX_BYTES``, and platforms without
    ``MAP_POPULATE``, get ``np.empty``."""
    dt = np.dtype(dtype)
    nbytes = math.prod(shape) * dt.itemsize
    populate = getattr(mmap, "MAP_POPULATE", None)
    if not (POPULATE_MIN_BYTES <= nbytes <= POPULATE_MAX_BYTES) or populate is None:
        return np.empty(shape, dt)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate
    buf = mmap.mmap(-1, nbytes, flags=flags)  # unmapped when the array's last view goes
    return np.frombuffer(buf, dtype=dt).reshape(shape)


def scaled_features(rows: np.ndarray, scaling: Scaling | None) -> np.ndarray:
    """``prepare_features`` from rows already in their per-row representation (the part that
    needs no input from the target): a new array, ``rows`` untouched; element for element (and
    dtype for dtype) the arithmetic of ``Scaling.apply``, done in place without temporaries,
    into memory mapped ahead (``populated_empty``)."""
    if scaling is None:
        x = populated_empty(rows.shape, rows.dtype)
        np.copyto(x, rows)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            x = populated_empty(rows.shape, np.result_type(rows, scaling.mean))
            np.subtract(rows, scaling.mean, out=x)
            if np.result_type(x, scaling.std) == x.dtype:
                np.divide(x, scaling.std, out=x)
            else:
                x = x / scaling.std
    with np.errstate(over="ignore"):  # (float32 rows: ±CLAMP itself overflows to ±inf)
        np.clip(x, -CLAMP, CLAMP, out=x)  # ±inf → ±CLAMP
    return np.nan_to_num(x, nan=0.0, copy=False)


def teacher_assignment(n_rows: int, n_teachers: int, key: bytes) -> np.ndarray:
    """Teacher of each record: a keyed hash (HMAC-SHA256) of its stable record id (its index
    in the source's dataset) modulo T. Adding, removing or replacing one record moves exactly
    that record's teacher, never a boundary between parts (``array_split`` of a permutation
    shifted the boundaries when n changed, moving two teachers)."""
    out = np.empty(n_rows, dtype=np.int64)
    for i in range(n_rows):
        h = hmac.new(key, i.to_bytes(8, "little"), hashlib.sha256).digest()
        out[i] = int.from_bytes(h[:8], "little") % n_teachers
    return out


class SourceReleaser:
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
        self._ensembles: dict[str, TeacherEnsemble] = {}
        self.domain = domain
        self.dataset = dataset
        self.ledger = ledger
        self.rng = rng
        self.public = public if public is not None else public_rng()
        self.representation = representation
        self.policy = policy if policy is not None else PrivacyPolicy()
        self.insecure_seed = insecure_seed
        self._sessions: dict[str, tuple[SessionTerms, SessionInfo, Scaling | None]] = {}
        self._features: dict[str, np.ndarray] = {}  # scaling digest → prepared features (LRU)
        self._rows: np.ndarray | None = None  # the per-row representation (``rows``)
        self._feat_lock = threading.Lock()
        self._rows_lock = threading.Lock()
        self._ens_lock = threading.Lock()  # guards _ens_locks
        self._ens_locks: dict[str, threading.Lock] = {}  # per session: its teachers' training
        self._bound: dict[str, dict[str, Any]] = {}  # session → what its charges depend on
        self._noise: dict[str, np.random.Generator] = {}  # session → its own noise stream

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
        }
        return PreparedSession(terms, disclosure.scaling, m, plan, bound)

    def install(self, prepared: PreparedSession, sid: str) -> SessionInfo:
        """Make a prepared session live. The features are prepared lazily, on the first draw,
        and shared by every session with the same scaling (``_features``)."""
        k = self.domain.x.shape[1]
        n = self.domain.x.shape[0]
        info = SessionInfo(sid, n, k, self.domain.n_classes, prepared.projection, prepared.plan)
        self._sessions[sid] = (prepared.terms, info, prepared.scaling)
        # a fresh CSPRNG stream per session; a seeded (testing) releaser keeps its one stream
        self._noise[sid] = secure_rng() if is_cryptographic(self.rng) else self.rng
        self._bound[sid] = prepared.bound
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
        scaling = self._sessions[session_id][2]
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
        (cold, a composition costs 30–130 ms, measured, that otherwise sits inside the
        release, under the handlers' lock). The features are not prepared ahead: a session
        costs no memory until a release needs it (issue 12, item 4)."""
        terms, info = self.session(session_id)
        if not (0 <= index < info.plan.releases):
            return
        event = info.plan.release_spec(terms, index).dp_event()
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
            event = prepared.plan.release_spec(terms, 0).dp_event()
            caps = [("session", terms.epsilon, []), *extra_caps]
            try:
                self.ledger.check(self.dataset, [event], caps)
            except BudgetExceeded:
                pass  # OpenSession's release will say so, with the numbers

    def session(self, session_id: str) -> tuple[SessionTerms, SessionInfo]:
        try:
            terms, info, _ = self._sessions[session_id]
        except KeyError:
            raise InvalidInput("unknown or closed session") from None
        return terms, info

    def resident(self, session_id: str) -> bool:
        return session_id in self._sessions

    def restore_session(
        self,
        session_id: str,
        terms: SessionTerms,
        projection: np.ndarray,
        disclosure: TargetDisclosure,
    ) -> SessionInfo:
        """Rebuild a session after a restart from its stored terms, projection and disclosure
        (the same policy checks and floors apply)."""
        return self.install(self.prepare(terms, disclosure, projection), session_id)

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
        if not (0 <= index < info.plan.releases):
            raise InvalidInput("batch index out of range")
        spec = info.plan.release_spec(terms, index)
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
                **self._bound[session_id],
            },
            extra_caps=[("session", terms.epsilon, prior), *extra_caps],
        )
        return self.draw(session_id, index, entry)

    def draw(self, session_id: str, index: int, entry: LedgerEntry) -> BatchRelease:
        """Sample and add noise for an entry that is already durably in the ledger."""
        terms, info = self.session(session_id)
        x = self.features(session_id)
        spec = info.plan.release_spec(terms, index)
        if isinstance(spec, MetricSpec):
            rel = self._draw_metric(x, terms, spec, info, index, entry)
        else:
            rel = self._draw(x, spec, info, index, entry)
        self.ledger.store.update_signatures(self.dataset, entry.seq, rel.sha256(), "", "")
        return rel

    def _draw(
        self, x: np.ndarray, spec: BatchSpec, info: SessionInfo, index: int, entry: LedgerEntry
    ) -> BatchRelease:
        y = self.domain.labels()
        terms = self._sessions[info.session_id][0]
        rng = self._noise[info.session_id]
        if terms.release != "rows":
            return self._draw_aggregate(x, terms, spec, info, index, entry)
        if spec.sampling_rate is None:
            rows = np.arange(x.shape[0])
        else:
            rows = np.flatnonzero(rng.random(x.shape[0]) < spec.sampling_rate)
        # Label-sorted blocks, random order inside each class (no link to storage order).
        rows = rows[rng.permutation(rows.size)]
        rows = rows[np.argsort(y[rows], kind="stable")]
        with np.errstate(over="ignore", invalid="ignore"):
            proj = finite_rows(x[rows] @ info.projection)
        if terms.privacy_unit == "record":
            proj = clip_rows(proj, terms.clip_norm)
        z = proj + gaussian_noise(proj.shape, spec.features.noise_std, rng)
        counts = label_counts(y[rows], info.n_classes)
        return BatchRelease(index, z, self._noisy_counts(counts, spec, rng), spec, entry.seq)

    def _draw_metric(
        self,
        x: np.ndarray,
        terms: SessionTerms,
        spec: MetricSpec,
        info: SessionInfo,
        index: int,
        entry: LedgerEntry,
    ) -> BatchRelease:
        """The learned ground cost W (``dpda.dp.metric``): rows projected, made finite and
        clipped to the session's norm C as for every record-level release; the noise is the
        spec's σ·2mG on each step's clipped pair-gradient sum. Nothing but W leaves (no counts)."""
        y = self.domain.labels()
        rng = self._noise[info.session_id]
        with np.errstate(over="ignore", invalid="ignore"):
            z = clip_rows(x @ info.projection, terms.clip_norm)
        w = train_metric(z, y, metric_params(terms), terms.clip_norm, spec.noise_multiplier, rng)
        return BatchRelease(index, w, np.zeros(0, dtype=np.int64), spec, entry.seq)

    @staticmethod
    def _noisy_counts(counts: np.ndarray, spec: BatchSpec, rng: np.random.Generator) -> np.ndarray:
        h = spec.histogram
        if h.mechanism == "discrete_laplace":
            noisy = counts + discrete_laplace_noise(counts.shape, h.parameter, rng)
        else:
            noise = gaussian_noise(counts.shape, h.noise_std, rng)
            noisy = np.rint(counts + noise).astype(np.int64)
        return noisy

    def _draw_aggregate(
        self,
        x: np.ndarray,
        terms: SessionTerms,
        spec: BatchSpec,
        info: SessionInfo,
        index: int,
        entry: LedgerEntry,
    ) -> BatchRelease:
        """Per-class sums of clipped projected rows (+ sums of squares) with Gaussian noise, or
        DP-Sinkhorn synthetic points (``dpda.dp.sinkhorn_synthetic``) trained on those rows."""
        y = self.domain.labels()
        rng = self._noise[info.session_id]
        c = terms.clip_norm
        with np.errstate(over="ignore", invalid="ignore"):
            # the source's own space: the identity map, applied as what it is
            z = clip_rows(finite_rows(x) if terms.source_space else x @ info.projection, c)
        if terms.release == "sinkhorn-synthetic":
            # counts first: they set the points per class and the gradients' scale
            noisy = self._noisy_counts(label_counts(y, info.n_classes), spec, rng)
            pts = train_synthetic(
                z, y, noisy, synthetic_params(terms), spec.features.noise_multiplier, rng
            )
            return BatchRelease(index, pts, noisy, spec, entry.seq)
        sums = class_sums(z, y, info.n_classes)  # one record moves one row by ≤ C
        if terms.release == "prototypes":
            out = sums + gaussian_noise(sums.shape, spec.features.noise_std, rng)
        else:
            # [S/C, Q/C²]: one record moves one class block by ≤ √2 (the spec's sensitivity)
            v = np.hstack([sums / c, class_sums(z * z, y, info.n_classes) / (c * c)])
            v = v + gaussian_noise(v.shape, spec.features.noise_std, rng)
            ell = z.shape[1]
            out = np.hstack([v[:, :ell] * c, v[:, ell:] * (c * c)])
        counts = label_counts(y, info.n_classes)
        return BatchRelease(index, out, self._noisy_counts(counts, spec, rng), spec, entry.seq)

    # ------------------------------------------------------------------------------ PATE
    def _teachers(self, session_id: str) -> TeacherEnsemble:
        """The session's teachers, trained on first use. The daemon calls this before it takes
        its lock (``prepare_teachers``): training can take seconds and must not hold up other
        sessions' releases."""
        terms, info = self.session(session_id)
        # one session's training waits only for itself: a peer's 600 teachers must not hold
        # up another session's teachers
        with self._ens_lock:
            lock = self._ens_locks.setdefault(session_id, threading.Lock())
        with lock:
            return self._ensemble(session_id, terms, info)

    prepare_teachers = _teachers

    def _ensemble(self, session_id: str, terms: SessionTerms, info: SessionInfo) -> TeacherEnsemble:
        ens = self._ensembles.get(session_id)
        if ens is None:
            x = self.features(session_id)
            feats = x @ info.projection if terms.pate_space == "projected" else x
            # the hash key comes from the session's noise stream: a CSPRNG in the daemon,
            # reproducible under an insecure testing seed (so service = simulate)
            key = self._noise[session_id].bytes(32)
            parts = teacher_assignment(feats.shape[0], terms.pate_teachers, key)
            ens = TeacherEnsemble(
                feats, self.domain.labels(), parts, terms.pate_teachers, info.n_classes
            )
            self._ensembles[session_id] = ens
        return ens

    def check_queries(self, session_id: str, queries: np.ndarray) -> None:
        terms, info = self.session(session_id)
        if info.plan.pate_scale is None:
            raise InvalidInput("PATE is not part of this session's terms")
        if terms.pate_space == "raw" and not self.allow_raw_queries:
            raise InvalidInput("this source does not accept raw-space queries")
        dim = info.projection.shape[1] if terms.pate_space == "projected" else info.n_features
        if queries.ndim != 2 or queries.shape[1] != dim or queries.shape[0] < 1:
            raise InvalidInput("queries have the wrong shape")
        if not np.all(np.isfinite(queries)):
            raise InvalidInput("queries have non-finite values")
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
        terms, info = self.session(session_id)
        mine = [e for e in self.ledger.store.entries(self.dataset) if e.session == session_id]
        asked = sum(int(e.params.get("n_queries", 0)) for e in mine)
        if asked + queries.shape[0] > info.plan.pate_queries:
            raise BudgetExceeded("the session's PATE queries are used up")
        scale = float(info.plan.pate_scale)  # type: ignore[arg-type]
        event = answers_event(terms.pate_aggregator, scale, queries.shape[0])
        prior = [event_from_json(e.dp_event) for e in mine]
        entry = self.ledger.charge(
            dataset=self.dataset,
            events=[event],
            session=session_id,
            peer=peer,
            request_id=f"{session_id}/pate/{index}",
            privacy_unit="record",
            neighbouring=terms.neighbouring,
            params={
                "kind": "pate",
                "aggregator": terms.pate_aggregator,
                "scale": scale,
                "n_queries": int(queries.shape[0]),
                "teachers": terms.pate_teachers,
                "delta": self.ledger.budgets[self.dataset].delta,
                "queries_sha256": queries_digest(queries),
                **({"insecure_seed": True} if self.insecure_seed else {}),
            },
            extra_caps=[("session", terms.epsilon, prior), *extra_caps],
        )
        return self.draw_answer(session_id, queries, entry, votes)

    def votes(self, session_id: str, queries: np.ndarray) -> np.ndarray:
        """The teachers' vote counts on ``queries``: deterministic, no noise and no charge, so
        they are counted outside any lock (the work a peer sizes by its number of queries)."""
        return self._teachers(session_id).votes(queries)

    def query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray:
        """The ``ReleaseSource`` view of ``answer``: only the labels."""
        return self.answer(session_id, index, queries).labels

    def draw_answer(
        self,
        session_id: str,
        queries: np.ndarray,
        entry: LedgerEntry,
        votes: np.ndarray | None = None,
    ) -> PateAnswer:
        """Votes (unless counted before) and noise for an entry already durably in the ledger."""
        terms, info = self.session(session_id)
        if votes is None:
            votes = self._teachers(session_id).votes(queries)
        scale = float(entry.params["scale"])
        labels = noisy_argmax(votes, terms.pate_aggregator, scale, self._noise[session_id])
        ans = PateAnswer(labels, entry.seq)
        self.ledger.store.update_signatures(self.dataset, entry.seq, ans.sha256(), "", "")
        return ans

    def close_session(self, session_id: str) -> None:
        self._sessions.pop(session_id, None)
        self._ensembles.pop(session_id, None)
        with self._ens_lock:
            self._ens_locks.pop(session_id, None)
        self._bound.pop(session_id, None)
        self._noise.pop(session_id, None)
