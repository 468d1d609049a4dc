"""Black-box ε auditing: Clopper–Pearson lower bounds on ε from draws of a mechanism.

The question an audit answers: given many independent outputs of a mechanism on a neighbouring
pair (D, D′), how large must ε be for the outputs to be consistent with (ε, δ)-DP? For every
event E and both orders of the pair, (ε, δ)-DP requires

    P_D(E) ≤ e^ε · P_D′(E) + δ     ⇒     ε ≥ log((P_D(E) − δ) / P_D′(E)).

Replacing P_D(E) by a one-sided Clopper–Pearson *lower* bound and P_D′(E) by a one-sided *upper*
bound, each at level α/2 (Bonferroni across the two), gives a lower bound on ε that holds with
probability ≥ 1 − α, whatever the mechanism, provided E was fixed before the counts were taken.

No selection bias. The event is chosen on one half of the draws (the "selection" half) and the
bound is computed on the other half only: choosing the best of many events on the same draws that
are then counted would make the bound optimistic. With i.i.d. draws the first half of each sample
is as good a random half as any, so the split is deterministic. Candidates are ranked by the same
bound at the stricter level α/10 (it favours events with enough mass to hold up on the other
half); that only decides which event is evaluated, never the level of the reported bound.

Events. Outputs are reduced to one real score per draw (the auditor's statistic). The candidate
events are the upper and lower sets {s ≥ t} and {s ≤ t}, t ranging over observed values of the
selection half (at most ``max_candidates`` of them, evenly spaced in rank), and both orders of
the pair (D or D′ in the numerator). Discrete outputs (labels, integer counts) work the same way:
ties are kept together, so every candidate is an exact event set of the discrete output (for a
label, score it by an indicator or an ordering of the labels; ``epsilon_lower_bound_sets`` takes
explicit event sets as boolean membership columns). Scores of −inf are allowed (e.g. "the record
was not in the batch") and fall in every lower set and no upper set of a finite threshold.

What the number means. For a Gaussian mechanism with the optimal (likelihood-ratio) event the
population value of ``log((P_D(E) − δ)/P_D′(E))`` maximised over E equals the ε(δ) of the exact
privacy curve, so an audit at δ_a can reach the charged ε(δ_a) but not exceed it when the charge
is right; a mechanism with less noise than charged pushes it above. Any δ_a is legitimate: a
``DpEvent`` fixes the whole curve ε(δ), and every point of it is a claim the mechanism must meet;
auditing at a δ_a where the optimal event has probability ≫ 1/n is what makes a finite sample
informative.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.stats import beta


def cp_lower(k: np.ndarray | int, n: int, alpha: float) -> np.ndarray:
    """One-sided Clopper–Pearson lower bound at level α: P(p ≥ bound) ≥ 1 − α (0 when k = 0)."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = beta.ppf(alpha, k, n - k + 1)
    return np.where(k <= 0, 0.0, out)


def cp_upper(k: np.ndarray | int, n: int, alpha: float) -> np.ndarray:
    """One-sided Clopper–Pearson upper bound at level α: P(p ≤ bound) ≥ 1 − α (1 when k = n)."""
    k = np.asarray(k, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = beta.ppf(1.0 - alpha, k + 1, n - k)
    return np.where(k >= n, 1.0, out)


def _log_ratio(
    k_num: np.ndarray, n_num: int, k_den: np.ndarray, n_den: int, delta: float, alpha: float
) -> np.ndarray:
    """log((CP_low(k_num/n_num) − δ) / CP_high(k_den/n_den)), each bound at level α/2; −inf
    where the lower bound does not exceed δ (no evidence)."""
    lo = cp_lower(k_num, n_num, alpha / 2) - delta
    hi = cp_upper(k_den, n_den, alpha / 2)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(lo > 0, np.log(np.maximum(lo, 1e-300) / hi), -np.inf)


@dataclass(frozen=True)
class Audit:
    """The result of one audit: the bound and the event that gave it (on the evaluation half)."""

    epsilon: float  # lower bound on ε at ``delta`` (−inf: no evidence at all)
    delta: float
    event: str  # e.g. "s >= 1.37, D' over D"
    k_num: int  # evaluation-half counts of the event under the numerator / denominator dataset
    n_num: int
    k_den: int
    n_den: int

    def __float__(self) -> float:
        return self.epsilon


def _best(
    sel_counts: list[tuple[np.ndarray, np.ndarray]],
    n_sel: tuple[int, int],
    delta: float,
    alpha: float,
) -> tuple[int, int, bool]:
    """(family, index, D′-in-numerator) of the best candidate on the selection half, scored by
    the same bound at the stricter level α/10: among many candidates, the plain maximum favours
    thin tail events whose selection-half counts were lucky; the stricter level prefers events
    with enough mass to hold up on the other half. It only decides which event is evaluated."""
    alpha = alpha / 10
    best = (-math.inf, 0, 0, False)
    for fam, (k_d, k_dp) in enumerate(sel_counts):
        for swapped, (kn, nn, kd, nd) in enumerate(
            [(k_d, n_sel[0], k_dp, n_sel[1]), (k_dp, n_sel[1], k_d, n_sel[0])]
        ):
            if kn.size == 0:
                continue
            v = _log_ratio(kn, nn, kd, nd, delta, alpha)
            i = int(np.argmax(v))
            if v[i] > best[0]:
                best = (float(v[i]), fam, i, bool(swapped))
    return best[1], best[2], best[3]


def _split(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    h = a.shape[0] // 2
    return a[:h], a[h:]


def _count_ge(sorted_scores: np.ndarray, t: np.ndarray) -> np.ndarray:
    return sorted_scores.size - np.searchsorted(sorted_scores, t, side="left")


def _count_le(sorted_scores: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.searchsorted(sorted_scores, t, side="right")


def audit_scores(
    scores_d: np.ndarray,
    scores_dprime: np.ndarray,
    delta: float,
    alpha: float = 0.05,
    max_candidates: int = 2000,
) -> Audit:
    """Lower-bound ε at ``delta`` from scores of draws on D and on D′ (see the module doc).

    Thresholds and direction (≥ or ≤, D or D′ in the numerator) are chosen on the first half of
    each sample; the bound is evaluated on the second half. Returns an ``Audit``.
    """
    s_d = np.asarray(scores_d, dtype=np.float64).ravel()
    s_dp = np.asarray(scores_dprime, dtype=np.float64).ravel()
    if np.isnan(s_d).any() or np.isnan(s_dp).any():
        raise ValueError("scores must not be NaN")
    if min(s_d.size, s_dp.size) < 4:
        raise ValueError("too few draws")
    sel_d, ev_d = (np.sort(h) for h in _split(s_d))
    sel_dp, ev_dp = (np.sort(h) for h in _split(s_dp))
    cand = np.unique(np.concatenate([sel_d, sel_dp]))
    cand = cand[np.isfinite(cand)]
    if cand.size > max_candidates:
        cand = cand[np.linspace(0, cand.size - 1, max_candidates).round().astype(int)]
    families = [
        (_count_ge(sel_d, cand), _count_ge(sel_dp, cand)),
        (_count_le(sel_d, cand), _count_le(sel_dp, cand)),
    ]
    fam, i, swapped = _best(families, (sel_d.size, sel_dp.size), delta, alpha)
    t = cand[i : i + 1]
    count = _count_ge if fam == 0 else _count_le
    k_d, k_dp = int(count(ev_d, t)[0]), int(count(ev_dp, t)[0])
    n_d, n_dp = ev_d.size, ev_dp.size
    kn, nn, kd, nd = (k_dp, n_dp, k_d, n_d) if swapped else (k_d, n_d, k_dp, n_dp)
    eps = float(_log_ratio(np.array([kn]), nn, np.array([kd]), nd, delta, alpha)[0])
    op = ">=" if fam == 0 else "<="
    order = "D' over D" if swapped else "D over D'"
    return Audit(eps, delta, f"s {op} {float(t[0]):.6g}, {order}", kn, nn, kd, nd)


def epsilon_lower_bound(
    scores_d: np.ndarray,
    scores_dprime: np.ndarray,
    delta: float,
    alpha: float = 0.05,
) -> float:
    """The ε lower bound of :func:`audit_scores`: ``log((p1_low − δ) / p0_high)`` for the event
    chosen on the other half (−inf when no event gives p1_low > δ)."""
    return audit_scores(scores_d, scores_dprime, delta, alpha).epsilon


def epsilon_lower_bound_sets(
    in_d: np.ndarray,
    in_dprime: np.ndarray,
    delta: float,
    alpha: float = 0.05,
    names: list[str] | None = None,
) -> Audit:
    """Explicit event sets for discrete outputs: ``in_d[i, j]`` says whether draw i on D fell in
    candidate event j (same columns for D′). Selection and evaluation halves as above."""
    a = np.asarray(in_d, dtype=bool)
    b = np.asarray(in_dprime, dtype=bool)
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[1]:
        raise ValueError("need (draws, events) boolean matrices with the same events")
    sel_a, ev_a = _split(a)
    sel_b, ev_b = _split(b)
    fams = [(sel_a.sum(0), sel_b.sum(0))]
    _, j, swapped = _best(fams, (sel_a.shape[0], sel_b.shape[0]), delta, alpha)
    k_a, k_b = int(ev_a[:, j].sum()), int(ev_b[:, j].sum())
    n_a, n_b = ev_a.shape[0], ev_b.shape[0]
    kn, nn, kd, nd = (k_b, n_b, k_a, n_a) if swapped else (k_a, n_a, k_b, n_b)
    eps = float(_log_ratio(np.array([kn]), nn, np.array([kd]), nd, delta, alpha)[0])
    name = names[j] if names else f"event {j}"
    order = "D' over D" if swapped else "D over D'"
    return Audit(eps, delta, f"{name}, {order}", kn, nn, kd, nd)
