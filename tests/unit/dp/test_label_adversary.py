"""The adversary of DESIGN.md §2 against the attribute unit's sorted release.

It knows every record but one, sees the label-sorted noisy rows and the noisy counts, matches the
released rows to the records it knows, and reads the remaining record's label off the block it
sits in. The README, the policy's opt-in key and the session terms say the attribute unit protects
neither labels nor membership; this test shows that claim is the one that holds: the adversary
wins far more often than chance.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import linear_sum_assignment

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling
from dpda.dp.ledger import Budget, MemoryLedgerStore, PrivacyLedger
from dpda.dp.mechanisms import counts_to_labels
from dpda.ot.costs import sq_euclidean
from dpda.policy import PrivacyPolicy
from dpda.protocol import TargetDisclosure
from dpda.source_party.releases import SourceReleaser
from dpda.terms import LABEL_CAVEAT, SessionTerms


def test_attribute_unit_does_not_hide_labels() -> None:
    rng = np.random.default_rng(0)
    n, k, q, trials = 60, 30, 3, 40
    wins = 0
    for trial in range(trials):
        x = rng.normal(0, 3, size=(n, k))
        y = rng.integers(0, q, size=n)
        terms = SessionTerms(
            dataset="d",
            epsilon=8,
            delta=1e-5,
            projection="jl",
            projection_dim=20,
            privacy_unit="attribute",
        )
        ledger = PrivacyLedger(MemoryLedgerStore(), {"d": Budget(8, 1e-5)})
        rel = SourceReleaser(
            Domain("d", x, y, q),
            "d",
            ledger,
            np.random.default_rng(trial),
            policy=PrivacyPolicy.rehearsal("attribute", "rows"),
        )
        info = rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(k), np.ones(k))))
        b = rel.release(info.session_id, 0)
        victim = trial % n
        known = np.delete(np.arange(n), victim)
        # match released rows to the known records; the unmatched row is the victim's
        cost = sq_euclidean(b.z, x[known] @ info.projection)
        rows, _ = linear_sum_assignment(cost)
        free = np.setdiff1d(np.arange(n), rows)[0]
        guess = counts_to_labels(b.noisy_counts, n)[free]
        wins += int(guess == y[victim])
    assert wins / trials > 0.8  # chance is 1/3: the label is not protected
    assert "neither labels nor membership" in LABEL_CAVEAT
