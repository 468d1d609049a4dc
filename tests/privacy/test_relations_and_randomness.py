"""Items 5, 6, 7 and 9 of the privacy issue: the relation, the randomness and the totals.

Each test states what happened on 9ac3bc1 (before the source owned its privacy).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling
from dpda.dp.ledger import Budget, MemoryLedgerStore, PrivacyLedger, totals_by_relation
from dpda.dp.rng import is_cryptographic
from dpda.errors import PolicyRefused
from dpda.policy import PrivacyPolicy
from dpda.protocol import TargetDisclosure
from dpda.service.admin import AdminApp
from dpda.service.metrics import Metrics
from dpda.source_party.releases import SourceReleaser
from dpda.terms import SessionTerms

ATTRIBUTE = PrivacyPolicy(
    units=("record", "attribute"),
    attribute_unit_exposes_labels_and_membership=True,
    releases=("rows", "prototypes"),
)


def _releaser(policy: PrivacyPolicy | None = None, **kw) -> tuple[SourceReleaser, PrivacyLedger]:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 6))
    y = (x[:, 0] > 0).astype(np.int64)
    ledger = PrivacyLedger(MemoryLedgerStore(), {"d": Budget(50, 1e-4)})
    return SourceReleaser(Domain("d", x, y, 2), "d", ledger, policy=policy, **kw), ledger


def _disclosure() -> TargetDisclosure:
    return TargetDisclosure(Scaling(np.zeros(6), np.ones(6)), np.eye(6)[:, :3])


def _terms(**kw) -> SessionTerms:
    return SessionTerms(
        **{
            "dataset": "d",
            "epsilon": 2.0,
            "delta": 1e-4,
            "projection_dim": 3,
            "projection": "target-pca",
            **kw,
        }
    )


def test_record_unit_minibatches_and_rows_are_refused() -> None:
    """Item 5. 9ac3bc1 released record-unit per-row minibatches charged as a subsampled Gaussian
    although an unsampled record sends *no* row, not a zero row. No bound is claimed now."""
    for kw in ({"batch_size": 10}, {}):
        with pytest.raises(ValidationError, match="attribute unit only"):
            _terms(privacy_unit="record", release="rows", **kw)


def test_sizes_are_public_so_the_relation_is_replace_one() -> None:
    """Item 6. 9ac3bc1 disclosed n_rows exactly and charged histograms and prototypes under
    add/remove (sensitivity 1, C), which neighbours of the same size exceed (audits: 1.44 and
    1.38 against a charged 1.00). Now add/remove is refused and record releases carry the
    replace-one sensitivities."""
    rel, ledger = _releaser(rng=np.random.default_rng(1))
    with pytest.raises(PolicyRefused, match="neighbouring 'add-remove'"):
        rel.open_session(_terms(neighbouring="add-remove"), _disclosure())
    info = rel.open_session(_terms(clip_norm=1.5), _disclosure())
    assert info.plan.histogram_sensitivity == 2
    assert info.plan.feature_sensitivity == pytest.approx(3.0)  # 2C
    rel.release(info.session_id, 0)
    entry = ledger.store.entries("d")[-1]
    assert entry.neighbouring == "replace-one" and entry.privacy_unit == "record"
    assert ledger.store.entries("d") and len(ledger.store.entries("d")) == 1


def test_noise_is_cryptographic_and_public_randomness_is_separate() -> None:
    """Item 7. 9ac3bc1 drew noise from PCG64 (state recoverable from outputs), drew the
    published JL matrix from the same stream that later made the noise, and one stream served
    every dataset and session."""
    public = np.random.default_rng(5)
    rel, _ = _releaser(policy=ATTRIBUTE, rng=_secure(), public=public)
    before = public.bit_generator.state
    a = rel.open_session(_terms(projection="jl"), _disclosure())
    assert public.bit_generator.state != before  # the JL matrix came from the public stream
    b = rel.open_session(_terms(projection="jl"), _disclosure())
    na, nb = rel.live(a.session_id).noise, rel.live(b.session_id).noise
    assert is_cryptographic(na) and is_cryptographic(nb) and na is not nb  # one per session
    assert na is not rel.rng and not np.array_equal(na.random(4), nb.random(4))
    # a seeded (testing) releaser says so in every ledger entry
    seeded, ledger = _releaser(rng=np.random.default_rng(3), insecure_seed=True)
    s = seeded.open_session(_terms(), _disclosure())
    seeded.release(s.session_id, 0)
    assert ledger.store.entries("d")[-1].params["insecure_seed"] is True


def _secure() -> np.random.Generator:
    from dpda.dp.rng import secure_rng

    return secure_rng()


def test_totals_are_per_relation_and_never_mixed() -> None:
    """Item 9. 9ac3bc1 composed attribute-unit and record-unit events into one ε and showed it
    as the dataset's ε in `ledger show`, the admin API and the metrics."""
    rel, ledger = _releaser(policy=ATTRIBUTE, rng=np.random.default_rng(2))
    rec = rel.open_session(_terms(), _disclosure())
    rel.release(rec.session_id, 0)
    only_record = totals_by_relation(ledger.store.entries("d"))
    assert only_record["record"] == pytest.approx(only_record["attribute"])
    assert 0 < only_record["record"] <= 2.0
    att = rel.open_session(_terms(privacy_unit="attribute"), _disclosure())
    rel.release(att.session_id, 0)
    mixed = totals_by_relation(ledger.store.entries("d"))
    assert mixed["record"] is None  # unbounded: attribute releases give no record guarantee
    assert mixed["attribute"] == pytest.approx(ledger.spent("d"))
    assert mixed["attribute"] > only_record["attribute"]
    app = AdminApp(Metrics(), ledger.store.entries, lambda: [], lambda: True, "t0k")
    auth = [(b"authorization", b"Bearer t0k")]
    status, _, body = app.handle({"path": "/v1/ledger/totals", "headers": auth})
    assert status == 200 and json.loads(body) == {"d": mixed}
    status, _, body = app.handle({"path": "/openapi.json", "headers": []})
    assert "/v1/ledger/totals" in json.loads(body)["paths"]
