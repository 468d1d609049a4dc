"""The data holder's side of the public-source deployment.

In this shape the serving daemon's rows are the private *target* of a peer that holds public
labeled rows. The peer sends its public rows in a shared space and the map of the holder's raw
rows into that space (per-row representation, column scaling, basis, scale); it then asks for
blocks of optimisation steps. For each block the holder charges its own ledger first, then reads
its rows — only through the second moment of their clipped images (``discrepancy.holder_rows``)
— and returns DP outputs only: the exponential mechanism's vertices (Frank–Wolfe methods) or
Gaussian-noised gradients (mirror descent).

What the guarantee rests on, and where each comes from (docs/privacy-model.md, "The public-source
setting"):

* ``r = 1``: the holder clips its mapped rows to norm 1 itself, whatever map was sent; a row the
  map sends to a non-finite value becomes 0 (a per-row rule, so still sensitivity-bounded);
* ``R``: the largest norm among the public rows it actually received (checked finite and ≤
  ``MAX_SOURCE_NORM``);
* ``n``: its own row count; ``μ``: from the terms, used as received (Δ∞ grows with it);
* ε₀ / σ: ``public_source_terms.plan_reweighting`` from ε, δ and the step count, recomputed by
  the peer;
* the iterate q (and w for single-stage) is advanced by the holder itself from the public rows
  and its own released outputs (``discrepancy.Reweighter``), never read from the peer.
"""

from __future__ import annotations

import hashlib
import math
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dpda.data.preprocessing import PublicSpace, Scaling
from dpda.dp import discrepancy as D
from dpda.dp.mechanisms import MIN_GAUSSIAN_STD
from dpda.dp.rng import is_cryptographic, secure_rng
from dpda.errors import InvalidInput, PolicyRefused
from dpda.planner import PlanRefused
from dpda.policy import reweighting_work
from dpda.public_source_terms import ReweightingPlan, ReweightingTerms, plan_reweighting, reweighter
from dpda.source_party.features import check_scaling
from dpda.source_party.releases import SourceReleaser

MAX_SOURCE_ROWS = 20_000
MAX_DIM = 512
MAX_SOURCE_NORM = 1e3  # R ≤ this: Δ∞ = μR²/n stays far from overflow
# R ≥ this: Δ∞ = R²·min(μ/n, 2) stays a normal positive float (rows of 1e-159 would make it 0,
# and with it the noise)
MIN_SOURCE_NORM = 1e-3
MAX_BLOCK_BYTES = 64 * 1024 * 1024  # one request's outputs (noisy-md: count × m × 8)
MAX_SESSION_BYTES = 1024 * 1024 * 1024  # all of a session's stored outputs
MAX_LABEL = 1e6
SCALE_RANGE = (1e-6, 1e6)


def rows_digest(rows: np.ndarray, labels: np.ndarray | None) -> str:
    h = hashlib.sha256(np.ascontiguousarray(rows, "<f8").tobytes())
    if labels is not None:
        h.update(np.ascontiguousarray(labels, "<f8").tobytes())
    return h.hexdigest()


@dataclass
class ReweightingSession:
    session_id: str
    peer: str
    dataset: str
    terms: ReweightingTerms
    plan: ReweightingPlan
    opt: D.Reweighter
    moment: np.ndarray  # (1/n) Σ t tᵀ of the holder's clipped rows: private
    sensitivity: float  # Δ∞ = R²·min(μr²/n, 2) (r = 1)
    rows_sha256: str
    rng: np.random.Generator
    lock: threading.Lock = field(default_factory=threading.Lock)
    last_used: float = field(default_factory=time.monotonic)


def _check_array(name: str, a: np.ndarray, shape: tuple[int, ...]) -> None:
    if a.shape != shape:
        raise InvalidInput(f"{name}: shape {a.shape}, expected {shape}", public=True)
    if not np.all(np.isfinite(a)):
        raise InvalidInput(f"{name}: every entry must be finite", public=True)


def prepare(
    releaser: SourceReleaser,
    session_id: str,
    peer: str,
    terms: ReweightingTerms,
    rows: np.ndarray,
    labels: np.ndarray | None,
    scaling: Scaling,
    basis: np.ndarray,
    scale: float,
) -> ReweightingSession:
    """Check everything the peer sent against public bounds, then build the session: nothing is
    charged or released here (the second moment is computed, held and never sent)."""
    policy = releaser.policy
    if not policy.allow_reweighting:
        raise PolicyRefused("this dataset's policy does not allow reweighting sessions")
    if "record" not in policy.units:
        raise PolicyRefused("reweighting protects whole records: the policy must allow them")
    budget = releaser.ledger.budgets.get(releaser.dataset)
    if budget is None or terms.delta != budget.delta:
        raise PolicyRefused(
            "delta differs from the dataset's delta"
            + ("" if budget is None else f" ({budget.delta:.6g})")
        )
    if policy.max_session_epsilon is not None and terms.epsilon > policy.max_session_epsilon:
        raise PolicyRefused(f"epsilon: above this source's {policy.max_session_epsilon:g}")
    x = releaser.domain.x
    n, k = x.shape
    if rows.ndim != 2 or not (2 <= rows.shape[0] <= MAX_SOURCE_ROWS):
        raise InvalidInput(f"rows: need 2 to {MAX_SOURCE_ROWS} rows", public=True)
    m, ell = rows.shape
    if not 1 <= ell <= min(MAX_DIM, k):
        raise InvalidInput(f"rows: {ell} columns, need 1 to {min(MAX_DIM, k)}", public=True)
    _check_array("rows", rows, (m, ell))
    # entries first: a norm of entries near 1e308 overflows before it can be compared
    if not np.all(np.abs(rows) <= MAX_SOURCE_NORM):
        raise InvalidInput(f"rows: every row's norm must be ≤ {MAX_SOURCE_NORM:g}", public=True)
    norm = float(np.max(np.linalg.norm(rows, axis=1)))
    if not norm <= MAX_SOURCE_NORM:
        raise InvalidInput(f"rows: every row's norm must be ≤ {MAX_SOURCE_NORM:g}", public=True)
    if not norm >= MIN_SOURCE_NORM:
        raise InvalidInput(f"rows: the largest row norm must be ≥ {MIN_SOURCE_NORM:g}", public=True)
    if terms.method == "single-stage":
        if labels is None:
            raise InvalidInput("labels: single-stage needs the public rows' labels", public=True)
        _check_array("labels", labels, (m,))
        if not np.all(np.abs(labels) <= MAX_LABEL):
            raise InvalidInput(f"labels: every |label| must be ≤ {MAX_LABEL:g}", public=True)
    elif labels is not None:
        raise InvalidInput(
            f"labels: only single-stage reads labels, not {terms.method}", public=True
        )
    check_scaling(scaling, k)
    _check_array("basis", basis, (k, ell))
    if not (math.isfinite(scale) and SCALE_RANGE[0] <= scale <= SCALE_RANGE[1]):
        raise InvalidInput(
            f"scale: must lie in [{SCALE_RANGE[0]:g}, {SCALE_RANGE[1]:g}]", public=True
        )
    work = reweighting_work(1, m, ell)
    if work > policy.max_reweighting_work:
        raise PolicyRefused(
            f"rows: one step on {m} rows of {ell} columns is {work:.3g} multiply-adds, above "
            f"this source's max_reweighting_work {policy.max_reweighting_work:.3g}"
        )
    try:
        plan = plan_reweighting(terms)
    except PlanRefused as exc:
        raise PolicyRefused(str(exc)) from None
    width = m if terms.method == "noisy-md" else 1
    if terms.steps * width * 8 > MAX_SESSION_BYTES:
        raise PolicyRefused(
            f"steps: {terms.steps} steps of {width} values each exceed the "
            f"{MAX_SESSION_BYTES // 2**20} MiB a session may store"
        )
    sensitivity = D.gradient_sensitivity(terms.smoothing, norm, 1.0, n)
    factor = D.Reweighter.scale_of(terms.method, terms.predictor_radius)
    noise = plan.step_parameter * math.sqrt(m) * factor * sensitivity
    if not (math.isfinite(sensitivity) and sensitivity > 1e-300):
        raise PolicyRefused("rows: the sensitivity at these rows is not a normal number")
    if terms.method == "noisy-md" and not noise >= MIN_GAUSSIAN_STD:
        raise PolicyRefused("rows: the noise at these rows would fall below the sampler's floor")

    space = PublicSpace(terms.representation, scaling, basis, scale)
    mapped = D.holder_rows(x, space.map, 1.0)
    opt: D.Reweighter = reweighter(terms, rows, labels)
    return ReweightingSession(
        session_id=session_id,
        peer=peer,
        dataset=releaser.dataset,
        terms=terms,
        plan=plan,
        opt=opt,
        moment=D.second_moment(mapped),
        sensitivity=sensitivity,
        rows_sha256=rows_digest(rows, labels),
        # a fresh CSPRNG stream per session; a seeded (testing) releaser keeps its one stream
        rng=secure_rng() if is_cryptographic(releaser.rng) else releaser.rng,
    )


def check_block(s: ReweightingSession, policy_work: float, start: int, count: int) -> None:
    if count < 1 or start < 0 or start + count > s.plan.steps:
        raise InvalidInput(
            f"steps {start}..{start + count}: the session has {s.plan.steps} steps", public=True
        )
    width = s.opt.x.shape[0] if s.terms.method == "noisy-md" else 1
    if count * width * 8 > MAX_BLOCK_BYTES:
        most = max(1, MAX_BLOCK_BYTES // (width * 8))
        raise PolicyRefused(f"count: at most {most} steps per request at these shapes")
    work = reweighting_work(count, *s.opt.x.shape)
    if work > policy_work:
        most = max(1, int(policy_work // reweighting_work(1, *s.opt.x.shape)))
        raise PolicyRefused(f"count: at most {most} steps per request at these shapes")


def step_output(s: ReweightingSession) -> Any:
    """The DP output of one step at the current iterate (the only read of the holder's rows):
    a vertex by the exponential mechanism, or the Gaussian-noised gradient (noisy-md)."""
    if s.terms.method == "noisy-md":
        return s.opt.noisy_gradient(s.moment, s.plan.step_parameter, s.sensitivity, s.rng)
    return s.opt.select(s.moment, s.plan.step_parameter, s.sensitivity, s.rng)


def draw(s: ReweightingSession, count: int) -> np.ndarray:
    """``count`` DP steps from the current iterate, advancing it; call only after the charge is
    durably in the ledger. Returns the vertices (int64) or the noisy gradients (count × m)."""
    out: list[Any] = []
    for _ in range(count):
        o = step_output(s)
        s.opt.advance(o)
        out.append(o)
    return np.asarray(out, dtype="<f8" if s.terms.method == "noisy-md" else "<i8")
