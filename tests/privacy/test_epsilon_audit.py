"""Black-box ε audit of every release mechanism, as called through ``SourceReleaser``.

DESIGN.md §2a, "Audited, not asserted": for each mechanism, many draws on a worst-case
neighbouring pair (D, D′) give a Clopper–Pearson lower bound on ε (``audit.py``) that must stay
below the ledger's charge, and the same test applied to a variant with 30% less noise must give
a bound above the charge (so the audit can fail).

How the mechanism is called. Each side of the pair is its own ``SourceReleaser`` with a seeded
noise generator (``insecure_seed``): a session is opened, one batch is released through
``release`` (the ledger charges ``spec.dp_event()``, which the test checks), then the mechanism
alone — ``batch_draws.draw_rows`` with that ledger entry, the session's prepared features and
its noise stream — is called once per draw (``release`` would recompose the whole ledger on
every call). The weakened variant is the same call with a spec whose noise is 30% smaller
(Gaussian multiplier ×0.7; discrete-Laplace parameter a/0.7), while the claim stays the
original event.

Which δ the claim is checked at. A ``DpEvent`` fixes the whole privacy curve ε(δ), and every
point of it is a claim the mechanism must meet, so auditing at a δ_a larger than the dataset's δ
is legitimate: at δ_a the optimal event has a probability the sample can estimate (for a
Gaussian, the best population value of log((P_D(E) − δ_a)/P_D′(E)) is exactly the curve's
ε(δ_a)). Pure-DP parts (discrete Laplace, LNMax) are checked at a tiny δ_a. The claimed ε is
``epsilon_of([event], δ_a, "pld", 1e-4)`` (pessimistic PLD, i.e. an upper bound on the curve).

Which event is the claim. Attribute-unit releases charge the feature Gaussian alone. Record-unit
prototypes and class-gaussians charge the joint mechanism (``LabelBranchDpEvent``: the sums'
Gaussian alone when the replaced record keeps its label; the sums' Gaussian at the cross-class
sensitivity with one DLap(a) per moved count when it changes label), and each of the two
worst-case pairs is audited against the whole charge, with terms under which its branch is the
larger one (so the power check means something). Sinkhorn-synthetic charges
``Composed(Gaussian(σ), DiscreteLaplace(a, 2))``; its features are audited against their own
part of that composition: the composed ε is larger than the part's, so a part that stays below
its own charge stays below the composed one too.

Sample sizes and δ_a are chosen from a power calculation (noted at each test) so that the whole
file runs in well under a minute on two cores; all generators are seeded, so the numbers are
deterministic. Each test prints its row of the audit table (run with ``-s`` to see it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pytest
from dp_accounting import dp_event
from pydantic import ValidationError

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling
from dpda.dp.accounting import epsilon_of
from dpda.dp.events import (
    BatchSpec,
    LabelBranchDpEvent,
    RevealedSampledGaussianDpEvent,
    branch_of,
    event_to_json,
)
from dpda.dp.ledger import Budget, LedgerEntry, MemoryLedgerStore, PrivacyLedger
from dpda.dp.mechanisms import class_sums, clip_rows
from dpda.dp.pate import answers_event, noisy_argmax
from dpda.planner import PlanRefused, plan_batches
from dpda.policy import PrivacyPolicy
from dpda.protocol import BatchRelease, SessionInfo, TargetDisclosure
from dpda.source_party.batch_draws import draw_metric, draw_rows
from dpda.source_party.releases import SourceReleaser
from dpda.terms import SessionTerms

from .audit import Audit, audit_scores, epsilon_lower_bound_sets

pytestmark = pytest.mark.slow  # every test here takes seconds (real daemons or long runs)

DATASET = "audit"
DELTA = 1e-5  # the dataset's δ (what sessions are calibrated to)
WEAKER = 0.7  # the power variant: 30% less noise
ALPHA = 0.05


# ------------------------------------------------------------------------------------ plumbing
@dataclass
class Side:
    """One dataset of the pair behind its own releaser, with one charged release done."""

    rel: SourceReleaser
    info: SessionInfo
    terms: SessionTerms
    spec: BatchSpec
    x: np.ndarray  # the session's prepared features (what ``draw`` passes to ``draw_rows``)
    entry: LedgerEntry

    def draws(
        self, n: int, stat: Callable[[BatchRelease], float], spec: BatchSpec | None = None
    ) -> np.ndarray:
        s = self.spec if spec is None else spec
        x, info, entry, terms = self.x, self.info, self.entry, self.terms
        y, rng = self.rel.domain.labels(), self.rel.live(info.session_id).noise
        return np.array(
            [stat(draw_rows(x, y, terms, s, info, 0, entry, rng)) for _ in range(n)],
            dtype=np.float64,
        )


def _side(
    x: np.ndarray,
    y: np.ndarray,
    q: int,
    terms: SessionTerms,
    policy: PrivacyPolicy,
    disclosure: TargetDisclosure,
    seed: int,
) -> Side:
    ledger = PrivacyLedger(MemoryLedgerStore(), {DATASET: Budget(100.0, DELTA)})
    rel = SourceReleaser(
        Domain(DATASET, x, y, q),
        DATASET,
        ledger,
        np.random.default_rng(seed),
        policy=policy,
        insecure_seed=True,
    )
    info = rel.open_session(terms, disclosure)
    rel.release(info.session_id, 0)  # the real path once: charge, then draw
    entry = ledger.store.entries(DATASET)[-1]
    spec = info.plan.spec(terms)
    assert entry.dp_event == event_to_json(spec.dp_event())  # the ledger charged the spec
    return Side(rel, info, terms, spec, rel.features(info.session_id), entry)


def _pair(
    x: np.ndarray,
    y: np.ndarray,
    x2: np.ndarray,
    y2: np.ndarray,
    q: int,
    terms: SessionTerms,
    policy: PrivacyPolicy,
    disclosure: TargetDisclosure,
    seed: int,
) -> tuple[Side, Side]:
    d, dp = (
        _side(x, y, q, terms, policy, disclosure, seed),
        _side(x2, y2, q, terms, policy, disclosure, seed + 1000),
    )
    assert d.spec == dp.spec  # public parameters only: the neighbours get the same spec
    return d, dp


def _weaker_features(spec: BatchSpec) -> BatchSpec:
    f = spec.features
    return replace(spec, features=replace(f, noise_multiplier=f.noise_multiplier * WEAKER))


def _weaker_histogram(spec: BatchSpec) -> BatchSpec:
    h = spec.histogram
    assert h.mechanism == "discrete_laplace"
    return replace(spec, histogram=replace(h, parameter=h.parameter / WEAKER))


def _claim(event: dp_event.DpEvent, delta_a: float) -> float:
    return epsilon_of([event], delta_a, "pld", 1e-4)


def _report(name: str, claimed: float, lb: Audit, weak: Audit | None, n: int) -> None:
    w = "—" if weak is None else f"{weak.epsilon:.3f} [{weak.event}]"
    print(
        f"\nAUDIT {name}: δ_a={lb.delta:.3g} claimed ε={claimed:.3f} lower bound={lb.epsilon:.3f}"
        f" [{lb.event}] weakened={w} N={n}/side"
    )


def _check(
    name: str,
    d: Side,
    dp: Side,
    stat: Callable[[BatchRelease], float],
    n: int,
    delta_a: float,
    claimed_event: dp_event.DpEvent,
    weaken: Callable[[BatchSpec], BatchSpec],
) -> None:
    claimed = _claim(claimed_event, delta_a)
    lb = audit_scores(d.draws(n, stat), dp.draws(n, stat), delta_a, ALPHA)
    weak = audit_scores(
        d.draws(n, stat, weaken(d.spec)), dp.draws(n, stat, weaken(dp.spec)), delta_a, ALPHA
    )
    _report(name, claimed, lb, weak, n)
    assert lb.epsilon < claimed, f"{name}: the mechanism leaks more than its charge"
    assert weak.epsilon > claimed, f"{name}: the audit cannot tell 30% less noise apart"


def _weaker_both(spec: BatchSpec) -> BatchSpec:
    return _weaker_histogram(_weaker_features(spec))


def _joint_event(spec: BatchSpec) -> LabelBranchDpEvent:
    """The charge of a record-unit aggregate (checked to be the joint mechanism)."""
    ev = spec.dp_event()
    assert isinstance(ev, LabelBranchDpEvent)
    assert ev.same_label == spec.features.dp_event()
    return ev


def _feature_event(spec: BatchSpec) -> dp_event.DpEvent:
    """The Gaussian part of a record-unit whole-batch charge (checked to be its first part)."""
    ev = spec.dp_event()
    assert isinstance(ev, dp_event.ComposedDpEvent)
    assert ev.events == [spec.features.dp_event(), spec.histogram.dp_event()]
    return ev.events[0]


def _orthonormal(k: int, ell: int, seed: int) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(k, k)))
    return q[:, :ell]


# --------------------------------------------------------------- 1. attribute unit, whole batch
def test_attribute_whole_batch_rows() -> None:
    """One feature of one record moves by the policy's bound b; the target's column std on that
    feature is 0.05, so the released row moves by b·‖M_j*‖/std_j* = 16·b (the whole map):
    a sensitivity computed without the std would be 16× too small and fail this audit by far.

    The record is the only one of class 0, so its noisy row is the first released row; the
    statistic is that row projected on M_j* (the direction it moves in). σ ≈ 0.645 (ε = 10,
    Theorem 2), μ = 1/σ ≈ 1.55; δ_a = 0.2, N = 3000 (power calculation: weakened margin ≈ +0.9).
    """
    b = 0.5
    m = np.array([[1.0, 0.0], [0.0, 0.6], [0.0, 0.8]])  # orthonormal columns; ‖M_2‖ = 0.8
    scaling = Scaling(np.array([0.1, -0.2, 0.3]), np.array([1.0, 1.0, 0.05]))
    x = np.array(
        [[0.2, -0.1, 0.4], [1.0, 1.0, 1.0], [-1.0, 0.0, 1.0], [0.5, 0.5, -0.5], [0.0, 0.0, 0.0]]
    )
    y = np.array([0, 1, 1, 2, 2])
    x2 = x.copy()
    x2[0, 2] += b
    terms = SessionTerms(
        dataset=DATASET,
        epsilon=10.0,
        delta=DELTA,
        privacy_unit="attribute",
        release="rows",
        projection="target-pca",
        projection_dim=2,
    )
    policy = PrivacyPolicy.rehearsal("attribute", "rows", attribute_bound=b)
    d, dp = _pair(x, y, x2, y, 3, terms, policy, TargetDisclosure(scaling, m), seed=11)
    assert d.info.plan.feature_sensitivity == pytest.approx(b * 0.8 / 0.05)
    assert isinstance(d.spec.dp_event(), dp_event.GaussianDpEvent)
    direction = m[2] / np.linalg.norm(m[2])

    def stat(r: BatchRelease) -> float:
        return float(r.z[0] @ direction)

    _check(
        "attribute whole-batch rows",
        d,
        dp,
        stat,
        3000,
        0.2,
        d.spec.dp_event(),
        _weaker_features,
    )


# --------------------------------------------------------------- 2. attribute unit, minibatch
def _minibatch_pair(batch_size: int) -> tuple[Side, Side]:
    """The issue's example: one record at 0 (class 0), 49 at 100 (class 1); the neighbour moves
    the first record's feature by 1; 1-d target-pca basis; σ = 1.1, one step."""
    x = np.vstack([np.zeros((1, 1)), np.full((49, 1), 100.0)])
    y = np.array([0] + [1] * 49)
    x2 = x.copy()
    x2[0, 0] = 1.0
    terms = SessionTerms(
        dataset=DATASET,
        epsilon=5.0,
        delta=DELTA,
        privacy_unit="attribute",
        release="rows",
        projection="target-pca",
        projection_dim=1,
        batch_size=batch_size,
        steps=1,
        noise_multiplier=1.1,
    )
    policy = PrivacyPolicy.rehearsal("attribute", "rows", attribute_bound=1.0)
    disclosure = TargetDisclosure(Scaling(np.zeros(1), np.ones(1)), np.ones((1, 1)))
    return _pair(x, y, x2, y, 2, terms, policy, disclosure, seed=21 + batch_size)


def _low_row(r: BatchRelease) -> float:
    """The released row below 50 (the audited record's, when it was sampled), else −inf."""
    low = r.z[:, 0][r.z[:, 0] < 50.0]
    return float(low[0]) if low.size else -math.inf


def test_attribute_minibatch_is_not_amplified() -> None:
    """The issue's example at p = 0.02: the revealed-sampling charge holds and the old amplified
    charge ``PoissonSampled(0.02, Gaussian(1.1))`` does not (failing before, passing now).

    Only the ~2% of draws that contain the record carry information, so at δ_a = 0.001
    (δ_a/p = 0.05 for the Gaussian inside) N = 50 000 per side gives a bound well above the old
    charge (0.056) and below the new one (1.35). The 30%-less-noise check at this p would need
    ~250 000 draws per side (the effective sample is N·p); it is run at p = 0.5 below.
    """
    d, dp = _minibatch_pair(batch_size=1)
    p = d.spec.sampling_rate
    assert p is not None and p == pytest.approx(0.02)
    assert d.spec.dp_event() == RevealedSampledGaussianDpEvent(1.1, p)
    delta_a, n = 0.001, 50_000
    claimed = _claim(d.spec.dp_event(), delta_a)
    old = _claim(dp_event.PoissonSampledDpEvent(p, dp_event.GaussianDpEvent(1.1)), delta_a)
    lb = audit_scores(d.draws(n, _low_row), dp.draws(n, _low_row), delta_a, ALPHA)
    _report(f"attribute minibatch p=0.02 (old amplified charge {old:.3f})", claimed, lb, None, n)
    assert lb.epsilon < claimed
    assert lb.epsilon > old, "the amplified (add/remove) charge would be under-charging"


def test_attribute_minibatch_power() -> None:
    """The same mechanism, statistic and test at p = 0.5 (batch_size 25), where N = 8000 per side
    leaves ~4000 sampled draws: δ_a = 0.05 (0.1 for the Gaussian inside), weakened margin ≈ +0.4.
    """
    d, dp = _minibatch_pair(batch_size=25)
    assert d.spec.dp_event() == RevealedSampledGaussianDpEvent(1.1, 0.5)
    _check(
        "attribute minibatch p=0.5",
        d,
        dp,
        _low_row,
        8000,
        0.05,
        d.spec.dp_event(),
        _weaker_features,
    )


# ------------------------------------------------------------ 3. record unit, label histogram
def test_record_label_histogram() -> None:
    """Replace-one with a label change: counts (2, 2) → (1, 3), DLap(a = 1) on each count; the
    label-change branch of the charge holds one ``DiscreteLaplace(a, 1)`` per moved count
    (pure ε = 2a together), audited here on its own.

    Statistic: the privacy loss sign of each count, s = 1[ñ₀ ≥ 2] + 1[ñ₁ ≤ 2] (the event s = 2 has
    probability ratio exactly e^{2a} between D and D′, so the test is tight with δ = 0).
    δ_a = 1e-6, N = 2000 (weakened: a = 1/0.7, ratio e^{2.86} against the charge e²).
    """
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 2))
    y = np.array([0, 0, 1, 1])
    y2 = np.array([1, 0, 1, 1])
    terms = SessionTerms(
        projection="target-pca",
        dataset=DATASET,
        epsilon=4.0,
        delta=DELTA,
        projection_dim=2,
        histogram_share=0.5,
    )
    disclosure = TargetDisclosure(Scaling(np.zeros(2), np.ones(2)), np.eye(2))
    d, dp = _pair(x, y, x, y2, 2, terms, PrivacyPolicy(), disclosure, seed=31)
    assert d.terms.release == "prototypes"  # the default policy's default release
    h = d.spec.histogram
    assert (h.mechanism, h.parameter, h.sensitivity) == ("discrete_laplace", 1.0, 2)
    change = branch_of(_joint_event(d.spec), "label_change")
    assert isinstance(change, dp_event.ComposedDpEvent)
    claimed_event = dp_event.ComposedDpEvent(change.events[1:])
    assert claimed_event == dp_event.ComposedDpEvent([dp_event.DiscreteLaplaceDpEvent(1.0, 1)] * 2)

    def stat(r: BatchRelease) -> float:
        return float((r.noisy_counts[0] >= 2) + (r.noisy_counts[1] <= 2))

    _check(
        "record label histogram (DLap)",
        d,
        dp,
        stat,
        2000,
        1e-6,
        claimed_event,
        _weaker_histogram,
    )


# ------------------------------------------------------------------ 4. record unit, prototypes
def _prototype_pair(
    terms: SessionTerms, label_change: bool, seed: int
) -> tuple[Side, Side, np.ndarray, np.ndarray, np.ndarray]:
    """D and D′ of a worst-case prototypes pair, C = 1.5, projected rows clipped in the plane
    of an orthonormal basis: a row r with r·M = 3e (clipped to C·e) in class 0 becomes −r in
    class 0 (same label: the class sum moves by 2C) or r′ with r′·M = 3f, f ⊥ e, in class 1
    (label change: two class sums move by C each, √2·C together, and both counts by one).
    Also returns the exact class sums of both sides and the counts of D (the auditor knows the
    pair)."""
    m = _orthonormal(3, 2, seed=4)
    e, f = np.array([0.6, 0.8]), np.array([0.8, -0.6])
    r = m @ (3.0 * e)
    x = np.vstack([r, m @ np.array([0.2, -0.4]), m @ np.array([1.0, 0.0]), [0.3, 0.1, -0.2]])
    y = np.array([0, 0, 1, 1])
    x2, y2 = x.copy(), y.copy()
    if label_change:
        x2[0], y2[0] = m @ (3.0 * f), 1
    else:
        x2[0] = -r
    disclosure = TargetDisclosure(Scaling(np.zeros(3), np.ones(3)), m)
    d, dp = _pair(x, y, x2, y2, 2, terms, PrivacyPolicy(), disclosure, seed=seed)
    c = terms.clip_norm
    sums = [class_sums(clip_rows(xs @ m, c), ys, 2) for xs, ys in ((x, y), (x2, y2))]
    return d, dp, sums[0], sums[1], np.bincount(y, minlength=2)


def _prototype_terms(epsilon: float, histogram_share: float) -> SessionTerms:
    return SessionTerms(
        projection="target-pca",
        dataset=DATASET,
        epsilon=epsilon,
        delta=DELTA,
        projection_dim=2,
        histogram_share=histogram_share,
        clip_norm=1.5,
        release="prototypes",
    )


def test_record_prototypes() -> None:
    """Same label: a row r (clipped to norm C) becomes −r, so the class sum moves by 2C, the
    same-label sensitivity; no count moves. At the release's defaults (calibration exact,
    histogram share 0.1) the same-label branch is the larger one, so the charge is this pair's
    Gaussian. Statistic: the class sum projected on r·M. ε = 6: σ ≈ 0.76, δ_a = 0.2 (charge
    ≈ 1.22, the weakened mechanism's ε(δ_a) ≈ 2.5), N = 3000.
    """
    terms = _prototype_terms(6.0, 0.1)
    assert terms.calibration == "exact" and SessionTerms(
        projection="target-pca", dataset=DATASET, epsilon=6.0, delta=DELTA
    ).histogram_share == pytest.approx(0.1)  # the defaults this test audits
    d, dp, _, _, _ = _prototype_pair(terms, label_change=False, seed=41)
    assert d.spec.features.sensitivity == pytest.approx(2 * terms.clip_norm)
    charged = _joint_event(d.spec)
    e = np.array([0.6, 0.8])

    def stat(rel: BatchRelease) -> float:
        return float(rel.z[0] @ e)

    _check("record prototypes, same label", d, dp, stat, 3000, 0.2, charged, _weaker_features)


def test_record_prototypes_label_change() -> None:
    """Label change: r in class 0 (clipped to C·e) replaced by r′ in class 1 (clipped to C·f,
    f ⊥ e): class 0's sum moves by C·e, class 1's by C·f, both counts by one. A histogram
    share of 0.5 makes the label-change branch the larger one (the charge is this pair's).
    Statistic: the pair's exact privacy loss, the Gaussian log-likelihood ratio of the two
    class sums plus the discrete-Laplace ones of the two counts (the Neyman–Pearson optimal
    events are its upper sets). The weakened variant has 30% less noise on the sums and on the
    counts. ε = 6: σ ≈ 0.96, a = 1.5, δ_a = 0.2 (charge ≈ 2.96, weakened ε(δ_a) ≈ 4.8),
    N = 3000.
    """
    terms = _prototype_terms(6.0, 0.5)
    d, dp, sums, sums2, counts = _prototype_pair(terms, label_change=True, seed=45)
    f = d.spec.features
    assert f.label_change_sensitivity == pytest.approx(math.sqrt(2) * terms.clip_norm)
    charged = _joint_event(d.spec)
    delta_a = 0.2
    # the label-change branch is the one charged at δ_a
    change = _claim(branch_of(charged, "label_change"), delta_a)
    assert change == pytest.approx(_claim(charged, delta_a))
    assert change > _claim(branch_of(charged, "same_label"), delta_a) + 1.0
    shift, mid, var = sums - sums2, (sums + sums2) / 2, f.noise_std**2
    a = d.spec.histogram.parameter
    n2 = counts + np.array([-1, 1])  # D′'s counts

    def stat(rel: BatchRelease) -> float:
        gauss = float(np.sum((rel.z - mid) * shift)) / var
        c = rel.noisy_counts
        dlap = a * float(np.sum(np.abs(c - n2) - np.abs(c - counts)))
        return gauss + dlap  # log p_D / p_D′ of the whole output

    _check("record prototypes, label change", d, dp, stat, 3000, delta_a, charged, _weaker_both)


# ----------------------------------------------------------- 4b. record unit, sinkhorn-synthetic
def test_record_sinkhorn_synthetic() -> None:
    """One synthetic point per class, one noisy gradient step (T = 1), so the released point is
    an invertible affine map of the noisy gradient sum: z = y₀ − η·C·(sum + noise)/n̂, with y₀ the
    public initial point and n̂ the released noisy count. Worst case: one real row far from the
    rest, r (clipped to C·e) replaced by −r; its clipped per-record vector goes from ≈ −e to ≈ +e,
    a move of ≈ 2 (the charged sensitivity); the 40 other rows sit at the origin and contribute
    the same in both. Statistic: the recovered noisy sum along e. σ ≈ 0.70 (ε = 12, a quarter to
    the histogram), δ_a = 0.2, N = 3000 as for prototypes.
    """
    from dpda.dp.sinkhorn_synthetic import initial_points

    c = 1.5
    m = _orthonormal(3, 2, seed=4)
    e = np.array([0.6, 0.8])
    r = m @ (3.0 * e)  # r·M = 3e: clipped to C·e
    x = np.vstack([r, np.zeros((40, 3)), m @ np.array([1.0, 0.0]), [0.3, 0.1, -0.2]])
    y = np.array([0] * 41 + [1, 1])
    x2 = x.copy()
    x2[0] = -r
    terms = SessionTerms(
        projection="target-pca",
        dataset=DATASET,
        epsilon=12.0,
        delta=DELTA,
        projection_dim=2,
        histogram_share=0.25,
        clip_norm=c,
        release="sinkhorn-synthetic",
        synthetic_points=1,
        sinkhorn_steps=1,
    )
    disclosure = TargetDisclosure(Scaling(np.zeros(3), np.ones(3)), m)
    d, dp = _pair(x, y, x2, y, 2, terms, PrivacyPolicy(), disclosure, seed=43)
    assert d.spec.features.sensitivity == pytest.approx(2.0) and d.spec.features.steps == 1
    y0 = initial_points(np.array([1, 1]), 2, c)[0][0]
    eta = terms.sinkhorn_learning_rate

    def stat(rel: BatchRelease) -> float:
        n_hat = max(float(rel.noisy_counts[0]), 1.0)
        return float((y0 - rel.z[0]) @ e * n_hat / (eta * c))

    _check(
        "record sinkhorn-synthetic",
        d,
        dp,
        stat,
        3000,
        0.2,
        _feature_event(d.spec),
        _weaker_features,
    )


# ------------------------------------------------------------- 5. record unit, class-gaussians
def test_record_class_gaussians() -> None:
    """The released block of a class is [S/C, Q/C²] (sums and sums of squares of the clipped
    projected rows), charged with the same-label sensitivity 3/√2 under replace-one.

    Worst case. Replacing a row C·u by C·v in the same class moves the block by
    (u − v, u⊙u − v⊙v); over ‖u‖, ‖v‖ ≤ 1 its norm is at most 3/√2 ≈ 2.121 (proved in
    ``mechanisms.class_gaussians_sensitivity``; attained at u = (cos 15°, sin 15°),
    v = (−sin 15°, −cos 15°), which this test uses). At the release's defaults (exact, share
    0.1) the same-label branch is the larger, so this pair reaches the charge. ε = 6: σ ≈ 0.76,
    δ_a = 0.3 (charge ≈ 0.75, weakened ε(δ_a) ≈ 1.9), N = 5000. C = 2 checks that the noise is
    added in the normalised units (a noise not rescaled with C² would show).
    """
    c = 2.0
    m = _orthonormal(3, 2, seed=5)
    ortho = np.linalg.svd(m.T)[2][-1]  # the direction the basis drops
    a15 = math.radians(15.0)
    u = np.array([math.cos(a15), math.sin(a15)])
    v = np.array([-math.sin(a15), -math.cos(a15)])
    x = np.vstack([m @ (c * u) + 0.5 * ortho, m @ np.array([0.3, -0.1]), m @ np.array([-1.0, 0.5])])
    y = np.array([0, 0, 1])
    x2 = x.copy()
    x2[0] = m @ (c * v) + 0.5 * ortho
    terms = SessionTerms(
        projection="target-pca",
        dataset=DATASET,
        epsilon=6.0,
        delta=DELTA,
        projection_dim=2,
        clip_norm=c,
        release="class-gaussians",
    )
    disclosure = TargetDisclosure(Scaling(np.zeros(3), np.ones(3)), m)
    d, dp = _pair(x, y, x2, y, 2, terms, PrivacyPolicy(), disclosure, seed=51)
    assert d.spec.features.sensitivity == pytest.approx(3 / math.sqrt(2))
    shift = np.concatenate([u - v, u * u - v * v])
    assert np.linalg.norm(shift) == pytest.approx(3 / math.sqrt(2))
    direction = shift / np.linalg.norm(shift)

    def stat(r: BatchRelease) -> float:
        block = np.concatenate([r.z[0, :2] / c, r.z[0, 2:] / (c * c)])
        return float(block @ direction)

    _check(
        "record class-gaussians",
        d,
        dp,
        stat,
        5000,
        0.3,
        _joint_event(d.spec),
        _weaker_features,
    )


# ------------------------------------------------------------------ 6. record unit, rows
def test_record_rows_are_refused() -> None:
    """Record-unit per-row releases claim no bound: whole-batch and minibatch terms are refused
    before anything is computed or charged (see the audit below for why)."""
    for batch_size in (0, 10):
        with pytest.raises(ValidationError):
            SessionTerms(
                projection="target-pca",
                dataset=DATASET,
                epsilon=4.0,
                delta=DELTA,
                privacy_unit="record",
                release="rows",
                batch_size=batch_size,
            )


def test_record_rows_label_change_breaks_the_row_charge() -> None:
    """Why record-unit rows are refused at every layer: a label change broke the row charge.

    Rows are sent sorted by label. D = {(C·e, class 0), (−C·e, class 1)} releases [C·e, −C·e];
    in D′ the first record moves to class 2 and the release is [−C·e, C·e]: two rows move by 2C
    each (2√2·C; with q classes in between it grows as 2C·√q), where the charge assumed 2C.
    Measured with this file's audit before the refusal (statistic (z₀ − z₁)·e, δ_a = 0.2,
    N = 2500 per side): lower bound 2.28 against a claimed 1.47. Terms that skip validation
    (``model_construct``) are now refused by the plan as well, before anything is drawn.
    """
    terms = SessionTerms.model_construct(
        dataset=DATASET,
        epsilon=12.0,
        delta=DELTA,
        privacy_unit="record",
        neighbouring="replace-one",
        projection="target-pca",
        projection_dim=2,
        histogram_share=0.25,
        clip_norm=1.0,
        release="rows",
        dpda=True,
        pate_epsilon=0.0,
        pate_queries=0,
        batch_size=0,
    )
    with pytest.raises(PlanRefused, match="attribute unit only"):
        plan_batches(terms, 2, np.eye(2))


# ------------------------------------------------------------------- 7. PATE at the vote level
def _pate_scale(aggregator: str, pate_epsilon: float) -> float:
    """σ (GNMax) or γ (LNMax) of one answer, from the plan of a session with one query."""
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(60, 2)), np.arange(60) % 3
    ledger = PrivacyLedger(MemoryLedgerStore(), {DATASET: Budget(100.0, DELTA)})
    rel = SourceReleaser(Domain(DATASET, x, y, 3), DATASET, ledger, rng, insecure_seed=True)
    terms = SessionTerms(
        projection="target-pca",
        dataset=DATASET,
        epsilon=pate_epsilon,
        delta=DELTA,
        dpda=False,
        pate_epsilon=pate_epsilon,
        pate_queries=1,
        pate_teachers=50,
        pate_aggregator=aggregator,  # type: ignore[arg-type]
        projection_dim=2,
    )
    info = rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(2), np.ones(2)), np.eye(2)))
    assert info.plan.pate_scale is not None
    scale = float(info.plan.pate_scale)
    # the releaser's own path once: it charges one answer's event and hands ``noisy_argmax``
    # the scale recorded in the entry (the vote-level audit below uses the same call)
    rel.pate.answer(info.session_id, 0, np.zeros((1, 2)))
    entry = ledger.store.entries(DATASET)[-1]
    assert entry.dp_event == event_to_json(answers_event(aggregator, scale, 1))
    assert entry.params["scale"] == scale
    return scale


@pytest.mark.parametrize(
    ("aggregator", "pate_epsilon", "delta_a"), [("gnmax", 3.0, 1e-2), ("lnmax", 3.0, 1e-6)]
)
def test_pate_noisy_argmax(aggregator: str, pate_epsilon: float, delta_a: float) -> None:
    """One record changes one teacher's vote (teachers are disjoint, assigned by a keyed hash of
    the record id): on every query the teacher's old class loses a vote and its new class gains
    one. Worst case: the teacher moves from the leader to the runner-up, so the gap g between
    them becomes g − 2. The released label is the noisy arg-max.

    Where the test is tight. With two live classes the arg-max is a threshold on the difference
    of the two noises, sitting at the gap: GNMax's difference is N(0, 2σ²), so "runner-up wins"
    is exactly the threshold test of a Gaussian with μ = 2/(√2σ) = √2/σ (the charged
    ``Gaussian(σ/√2)``) at threshold g/(√2σ); the best g is where that threshold is optimal at
    δ_a. LNMax's difference of two Laplaces has a log-ratio that approaches the charged 2γ as g
    grows while the probability shrinks. Since the best g depends on the noise (claimed or
    weakened), the pair is a *set of queries*, one per gap g = 1…16 (a third class holds the
    parity vote of the T = 50 teachers and never wins), and D′ moves the teacher on every query,
    as one record does. Each candidate event looks at ONE query's label, so its probabilities
    are those of a single answer on that query's vote pair, and the claim is the charge of one
    answer, ``answers_event(aggregator, scale, 1)``. The selection half picks the query and the
    label; the other half is counted.
    """
    scale = _pate_scale(aggregator, pate_epsilon)
    claimed = _claim(answers_event(aggregator, scale, 1), delta_a)
    teachers, gaps = 50, np.arange(1, 17)
    rest = (teachers - gaps) % 2
    n0, n1 = (teachers - rest + gaps) // 2, (teachers - rest - gaps) // 2
    votes_d = np.stack([n0, n1, rest], axis=1)  # (queries, classes)
    votes_dp = np.stack([n0 - 1, n1 + 1, rest], axis=1)
    assert np.all(votes_d.sum(1) == teachers) and np.all(votes_dp >= 0)
    n, chunk = 200_000, 10_000
    rng_d, rng_dp = np.random.default_rng(71), np.random.default_rng(72)

    def labels(votes: np.ndarray, s: float, rng: np.random.Generator) -> np.ndarray:
        """(n, queries) labels: n answers to the same queries (one call per chunk of draws)."""
        out = [
            noisy_argmax(np.tile(votes, (chunk, 1)), aggregator, s, rng).reshape(chunk, -1)
            for _ in range(n // chunk)
        ]
        return np.concatenate(out)

    names = [f"query g={g}: label {j}" for g in gaps for j in range(3)]

    def audit(s: float) -> Audit:
        lab_d, lab_dp = labels(votes_d, s, rng_d), labels(votes_dp, s, rng_dp)
        sets = np.arange(3)
        return epsilon_lower_bound_sets(
            (lab_d[:, :, None] == sets).reshape(n, -1),
            (lab_dp[:, :, None] == sets).reshape(n, -1),
            delta_a,
            ALPHA,
            names=names,
        )

    lb = audit(scale)
    # 30% less noise: σ·0.7 (GNMax) or Laplace scale (1/γ)·0.7, i.e. γ/0.7 (LNMax)
    weak = audit(scale * WEAKER if aggregator == "gnmax" else scale / WEAKER)
    _report(f"PATE {aggregator} (scale {scale:.4g})", claimed, lb, weak, n)
    assert lb.epsilon < claimed
    assert weak.epsilon > claimed


# ------------------------------------------------- 8. the reverse setting: a data holder's step
def test_public_source_frank_wolfe_selection() -> None:
    """The data holder's noisy Frank–Wolfe step (seed 001) picks a vertex with the exponential
    mechanism (``discrepancy.exponential_select``) on a gradient whose every coordinate one
    target row moves by at most Δ∞ (``test_discrepancy`` checks that bound). Worst case for the
    sampler: 50 candidate vertices, one target row moving candidate 0's loss down by Δ and every
    other loss up by Δ. Outcome: "vertex 0 chosen". Claim: ExponentialMechanismDpEvent(ε₀) at
    a tiny δ (pure ε₀); ε₀ = 1, N = 40,000 per side; the 30%-less-noise variant samples at
    ε₀/0.7."""
    from dpda.dp.discrepancy import exponential_select
    from dpda.dp.events import ExponentialMechanismDpEvent

    eps0, sens, k, n = 1.0, 0.01, 50, 40_000
    loss = np.zeros(k)
    loss2 = loss + sens
    loss2[0] -= 2 * sens

    def draws(losses: np.ndarray, eps: float, seed: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return np.array([float(exponential_select(losses, eps, sens, rng) == 0) for _ in range(n)])

    delta_a = 1e-9
    claimed = _claim(ExponentialMechanismDpEvent(eps0), delta_a)
    lb = audit_scores(draws(loss2, eps0, 1), draws(loss, eps0, 2), delta_a, ALPHA)
    weak = audit_scores(
        draws(loss2, eps0 / WEAKER, 3), draws(loss, eps0 / WEAKER, 4), delta_a, ALPHA
    )
    _report("public-source Frank–Wolfe selection", claimed, lb, weak, n)
    assert lb.epsilon < claimed, "the selection leaks more than its charge"
    assert weak.epsilon > claimed, "the audit cannot tell 30% less noise apart"


def test_public_source_holder_whole_map() -> None:
    """The data holder's whole path (``source_party.reweighting``): the peer's map of its raw
    rows, its own clip to norm 1, the second moment, the smooth-discrepancy gradient, the
    exponential mechanism at the planned ε₀ and the holder's own Δ∞ (here the data-free bound
    2R², since n = 4 < μ/2) — run on a neighbouring pair: four rows at 0, and one of them
    replaced by a far-away row that the clip must tame. Outcome: the draw lands in the set of
    vertices the replacement makes least likely (from the exact probabilities). Claim: the
    plan's one-step event (ε = 1). The exact log-ratio on this pair is 0.13, far below ε₀, so
    the power variant understates Δ∞ tenfold: the mistake the audit must catch on the whole
    map."""
    from dpda.public_source_terms import ReweightingTerms, plan_reweighting
    from dpda.source_party import reweighting as RW

    from ..support import memory_releaser

    ang = np.linspace(0, np.pi, 8, endpoint=False)
    public = np.column_stack([np.cos(ang), np.sin(ang)])
    terms = ReweightingTerms(dataset=DATASET, epsilon=1.0, delta=DELTA, steps=1)
    base = np.zeros((4, 2))
    far = base.copy()
    far[0] = [0.0, 1e6]  # clipped to (0, 1) by the holder

    def session(x: np.ndarray, seed: int) -> RW.ReweightingSession:
        rel, _ = memory_releaser(
            Domain(DATASET, x, None, 0),
            DATASET,
            Budget(100.0, DELTA),
            np.random.default_rng(seed),
            insecure_seed=True,
            policy=PrivacyPolicy(allow_reweighting=True),
        )
        scaling = Scaling(np.zeros(2), np.ones(2))
        return RW.prepare(rel, "s", "peer", terms, public, None, scaling, np.eye(2), 1.0)

    a, b = session(base, 1), session(far, 2)
    assert a.sensitivity == b.sensitivity == 2.0

    def probs(s: RW.ReweightingSession) -> np.ndarray:
        g = s.opt.private_gradient(s.moment) + s.opt.public_gradient()
        sc = -s.plan.step_parameter * g / (2 * s.sensitivity)
        p = np.exp(sc - sc.max())
        return p / p.sum()

    def event() -> np.ndarray:
        """The vertex set S maximising P_a(S)/P_b(S) among the sets of top log-ratios."""
        pa, pb = probs(a), probs(b)
        order = np.argsort(-np.log(pa / pb))
        best = max(range(1, len(order)), key=lambda k: pa[order[:k]].sum() / pb[order[:k]].sum())
        return order[:best]

    n = 40_000
    delta_a = 1e-9
    claimed = _claim(plan_reweighting(terms).event(1), delta_a)

    def draws(s: RW.ReweightingSession, where: np.ndarray) -> np.ndarray:
        return np.array([float(RW.step_output(s) in where) for _ in range(n)])

    honest = event()
    lb = audit_scores(draws(a, honest), draws(b, honest), delta_a, ALPHA)
    for s in (a, b):
        s.sensitivity /= 10  # the broken holder: ten times too little noise
    broken = event()
    weak = audit_scores(draws(a, broken), draws(b, broken), delta_a, ALPHA)
    _report("public-source holder, whole map", claimed, lb, weak, n)
    assert lb.epsilon < claimed, "the holder's step leaks more than its charge"
    assert weak.epsilon > claimed, "the audit cannot see a holder with 10× too little noise"


# ------------------------------------------- 9. the target's own disclosures (issue 19)
@pytest.mark.parametrize("part", ["column sums", "covariance"])
def test_target_disclosure(part: str) -> None:
    """The target's DP scaling and basis (``dpda.dp.target_disclosure``) through their real
    functions: the row clip and the noisy column sums (worst case: one row at +C·e₀ replaced by
    one at −C·e₀, outcome the first noisy sum), and Analyze Gauss (one z-row at C_z·e₀ replaced
    by one at C_z·e₁, outcome A₀₀ − A₁₁: the upper-triangle sensitivity √2·C_z² is reached).
    Claim: that part's Gaussian event at δ_a = 0.2 (ε = 8 over the three parts); the power
    variant draws with 30% less noise."""
    from dataclasses import replace as dc_replace

    from dpda.dp import target_disclosure as T

    k, n_rows = 2, 5
    plan = T.plan_disclosure(8.0, DELTA, k, "l2")
    index = 0 if part == "column sums" else 2
    sigma = plan.sigmas[index]
    c = plan.row_clip if part == "column sums" else plan.z_clip
    base = np.zeros((n_rows, k))
    x, x2 = base.copy(), base.copy()
    if part == "column sums":
        x[0, 0], x2[0, 0] = 5.0, -5.0  # clipped to ±C by the mechanism's own clip
    else:
        x[0, 0], x2[0, 1] = c, c

    def draws(rows: np.ndarray, p: T.DisclosurePlan, seed: int, n: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        if part == "column sums":
            r = T._clip(rows, p.row_clip)
            return np.array([T.dp_scaling(r, p, "zscore", rng).mean[0] for _ in range(n)])
        z = T._clip(rows, p.z_clip)
        out = np.empty(n)
        for i in range(n):
            a = T.dp_covariance(z, p, rng)
            out[i] = a[0, 0] - a[1, 1]
        return out

    n, delta_a = 3000, 0.2  # as the prototypes audit: a large δ_a where ε is estimable
    claimed = _claim(dp_event.GaussianDpEvent(sigma), delta_a)
    lb = audit_scores(draws(x, plan, 1, n), draws(x2, plan, 2, n), delta_a, ALPHA)
    sig = list(plan.sigmas)
    sig[index] *= WEAKER
    weak_plan = dc_replace(plan, sigmas=tuple(sig))  # type: ignore[arg-type]
    weak = audit_scores(draws(x, weak_plan, 3, n), draws(x2, weak_plan, 4, n), delta_a, ALPHA)
    _report(f"target disclosure, {part} (σ {sigma:.3g})", claimed, lb, weak, n)
    assert lb.epsilon < claimed, "the target's disclosure leaks more than its charge"
    assert weak.epsilon > claimed, "the audit cannot tell 30% less noise apart"


def test_target_row_queries() -> None:
    """The target's ``row_queries = "dp"`` (``noisy_rows``) through its real function: the
    queried rows (drawn without looking at the data) with one row at +5·e₀ replaced by one at
    −5·e₀, both clipped to ±C by the mechanism's own clip (the sensitivity 2C is reached);
    outcome: that query's first coordinate. Claim: the plan's Gaussian at δ_a = 0.2 for ε = 4;
    the power variant draws with 30% less noise."""
    from dataclasses import replace as dc_replace

    from dpda.dp import target_disclosure as T

    plan = T.plan_row_queries(4.0, DELTA)
    clip = 0.5
    x, x2 = np.zeros((3, 2)), np.zeros((3, 2))
    x[1, 0], x2[1, 0] = 5.0, -5.0

    def draws(rows: np.ndarray, p: T.RowQueryPlan, seed: int, n: int) -> np.ndarray:
        rng = np.random.default_rng(seed)
        return np.array([T.noisy_rows(rows, clip, p, rng)[1, 0] for _ in range(n)])

    n, delta_a = 3000, 0.2
    claimed = _claim(dp_event.GaussianDpEvent(plan.noise_multiplier), delta_a)
    lb = audit_scores(draws(x, plan, 1, n), draws(x2, plan, 2, n), delta_a, ALPHA)
    weak_plan = dc_replace(plan, noise_multiplier=plan.noise_multiplier * WEAKER)
    weak = audit_scores(draws(x, weak_plan, 3, n), draws(x2, weak_plan, 4, n), delta_a, ALPHA)
    _report(f"target row queries (σ {plan.noise_multiplier:.3g})", claimed, lb, weak, n)
    assert lb.epsilon < claimed, "the target's noisy row queries leak more than their charge"
    assert weak.epsilon > claimed, "the audit cannot tell 30% less noise apart"


# ---------------------------------------------------- 4c. record unit, the learned metric (003)
def test_record_metric(monkeypatch: pytest.MonkeyPatch) -> None:
    """The learned ground cost (``dpda.dp.metric``), audited at its worst case: one record in
    the maximum number of pairs (m = 4). ℓ = d′ = 1 and one step (T = 1), so the released
    W = 1 − η·(sum + noise)/P is an invertible affine map of the noisy clipped gradient sum.
    D: the record sits at u = 1 with label 0 and all other rows at the origin with label 0, so
    each of its m pairs is similar at distance 1 and its gradient (2) is clipped to +G. D′: the
    record is replaced by one at u = 0.5 with label 1, so each of its pairs is dissimilar inside
    the margin (μ = 1) with gradient exactly −G. Every other pair has Δ = 0 and gradient 0. The
    sum moves by 2mG, the charged sensitivity. Statistic: the recovered noisy sum. σ ≈ 0.74
    (ε = 12, a quarter to the histogram, 90% of the Gaussian part's μ² to the metric), δ_a = 0.2,
    N = 3000 per side, as for prototypes. The secret shuffle of the records is fixed to the
    identity (``secret_order``): shuffled, the record would land in a random position, a mixture
    that only lowers the loss; fixed, every draw is the worst case."""
    from dpda.dp import metric as metric_module
    from dpda.dp.events import MetricSpec
    from dpda.dp.metric import pair_graph

    monkeypatch.setattr(metric_module, "secret_order", lambda n, rng: np.arange(n))

    n, m_pairs, g = 20, 4, 0.5
    pairs = pair_graph(n, m_pairs)
    i = int(np.argmax(np.bincount(pairs.ravel(), minlength=n)))
    assert np.bincount(pairs.ravel(), minlength=n)[i] == m_pairs
    x = np.zeros((n, 2))
    y = np.zeros(n, dtype=np.int64)
    partners = set(pairs[pairs[:, 0] == i, 1]) | set(pairs[pairs[:, 1] == i, 0])
    other = next(j for j in range(n) if j != i and j not in partners)
    y[other] = 1  # both classes present; a row at the origin away from i: its pairs give 0
    x[i] = [1.0, 0.0]
    x2, y2 = x.copy(), y.copy()
    x2[i], y2[i] = [0.5, 0.0], 1
    terms = SessionTerms(
        projection="target-pca",
        dataset=DATASET,
        epsilon=12.0,
        delta=DELTA,
        projection_dim=1,
        histogram_share=0.25,
        clip_norm=1.0,
        release="prototypes",
        calibration="theorem2",  # the metric's σ this test was sized for
        cost="metric",
        metric_share=0.9,
        metric_dim=1,
        metric_pairs=m_pairs,
        metric_margin=1.0,
        metric_clip=g,
        metric_steps=1,
    )
    disclosure = TargetDisclosure(Scaling(np.zeros(2), np.ones(2)), np.array([[1.0], [0.0]]))
    n_pairs = pairs.shape[0]
    eta = terms.metric_learning_rate

    def side(xs: np.ndarray, ys: np.ndarray, seed: int):
        ledger = PrivacyLedger(MemoryLedgerStore(), {DATASET: Budget(100.0, DELTA)})
        rel = SourceReleaser(
            Domain(DATASET, xs, ys, 2),
            DATASET,
            ledger,
            np.random.default_rng(seed),
            policy=PrivacyPolicy(allow_metric=True),
            insecure_seed=True,
        )
        info = rel.open_session(terms, disclosure)
        index = info.plan.steps
        assert info.plan.is_metric(index)
        rel.release(info.session_id, index)  # the real path once: charge, then draw
        entry = ledger.store.entries(DATASET)[-1]
        spec = info.plan.metric_spec(terms)
        assert isinstance(spec, MetricSpec)
        assert entry.dp_event == event_to_json(spec.dp_event())  # the ledger charged the spec
        feats = rel.features(info.session_id)
        y_rel, rng = rel.domain.labels(), rel.live(info.session_id).noise

        def draws(k: int, s: MetricSpec) -> np.ndarray:
            out = np.empty(k)
            for j in range(k):
                w = draw_metric(feats, y_rel, terms, s, info, index, entry, rng).z
                out[j] = (1.0 - float(w[0, 0])) * n_pairs / eta
            return out

        return spec, draws

    spec, d = side(x, y, 47)
    spec2, dp = side(x2, y2, 1047)
    assert spec == spec2 and spec.sensitivity == pytest.approx(2 * m_pairs * g)
    claimed_event = spec.dp_event()
    assert claimed_event == dp_event.GaussianDpEvent(spec.noise_multiplier)  # T = 1
    n_draws, delta_a = 3000, 0.2
    claimed = _claim(claimed_event, delta_a)
    lb = audit_scores(d(n_draws, spec), dp(n_draws, spec), delta_a, ALPHA)
    weak_spec = replace(spec, noise_multiplier=spec.noise_multiplier * WEAKER)
    weak = audit_scores(d(n_draws, weak_spec), dp(n_draws, weak_spec), delta_a, ALPHA)
    _report("record metric", claimed, lb, weak, n_draws)
    assert lb.epsilon < claimed, "record metric: the mechanism leaks more than its charge"
    assert weak.epsilon > claimed, "record metric: the audit cannot tell 30% less noise apart"


def test_record_prototypes_in_the_sources_own_space() -> None:
    """The default release as the job runs it: class sums of the source's own rows, clipped to
    C at full dimension, no scaling or basis from the target. Same-label worst case: a row of
    norm 3 along e (clipped to C·e) becomes its opposite, the class sum moves by 2C. ε = 6,
    calibration exact, share 0.1: the charge is this pair's Gaussian; N = 3000, δ_a = 0.2."""
    terms = SessionTerms(dataset=DATASET, epsilon=6.0, delta=DELTA, clip_norm=1.5)
    assert terms.projection == "source" and terms.calibration == "exact"
    e = np.array([0.6, 0.8])
    x = np.vstack([3.0 * e, [0.2, -0.4], [1.0, 0.0], [0.3, 0.1]])
    y = np.array([0, 0, 1, 1])
    x2 = x.copy()
    x2[0] = -3.0 * e
    d, dp = _pair(x, y, x2, y.copy(), 2, terms, PrivacyPolicy(), TargetDisclosure(None, None), 43)
    assert d.spec.features.sensitivity == pytest.approx(2 * terms.clip_norm)
    charged = _joint_event(d.spec)

    def stat(rel: BatchRelease) -> float:
        return float(rel.z[0] @ e)

    _check("record prototypes, source space", d, dp, stat, 3000, 0.2, charged, _weaker_features)
