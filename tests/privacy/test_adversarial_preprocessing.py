"""The DP standardization over a real source daemon, against a hostile pinned target: a share
outside the source's policy is refused before any charge; an accepted session's first release
carries the statistics under its payload digest, in one composed, signed entry, and a retry
gets the stored ones back, never a second draw."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest

from dpda.dp.ledger import LedgerEntry, head_hash
from dpda.pb import dpda_pb2 as pb
from dpda.protocol import payload_digest
from dpda.service import serde
from tests.privacy.test_adversarial_target import (
    DATASET,
    RPC_TIMEOUT,
    K,
    Peer,
    _assert_policy_refusal,
    _module_source,
    _terms,
)

pytestmark = pytest.mark.slow  # a real daemon


@pytest.fixture(scope="module")
def default_source(tmp_path_factory) -> Iterator[Peer]:
    """A real source daemon with the default policy, and the hostile pinned target."""
    yield from _module_source(tmp_path_factory, None)


def _standardize(**kw: Any) -> dict[str, Any]:
    return _terms(projection="source", preprocessing="standardize", epsilon=2.0, **kw)


@pytest.mark.parametrize("share", [0.9, 0.001])
def test_a_share_outside_the_policy_is_refused_before_any_charge(
    default_source: Peer, share: float
) -> None:
    code, message = default_source.refused(_standardize(preprocessing_share=share))
    _assert_policy_refusal(code, message, "preprocessing_share")


def test_hostile_share_values_are_refused_before_any_charge(default_source: Peer) -> None:
    for bad in ("NaN", "-0.1", "1e308"):
        text = json.dumps(_standardize()).replace(
            '"preprocessing": "standardize"',
            f'"preprocessing": "standardize", "preprocessing_share": {bad}',
        )
        default_source.refused(text)


def test_the_statistics_travel_under_the_digest_in_one_signed_entry_and_replay(
    default_source: Peer,
) -> None:
    p = default_source
    resp = p.open(_standardize())
    before = len(p.remote_entries())
    (rel,) = p.release(resp.session_id)
    entries = p.remote_entries()
    assert len(entries) == before + 1  # one entry: the preprocessing composed with the release
    entry = entries[-1]
    assert entry.request_id == f"{resp.session_id}/0" and entry.source_sig
    assert "preprocessing" in entry.params
    assert entry.dp_event["type"] == "ComposedDpEvent" and len(entry.dp_event["events"]) == 2
    assert rel.HasField("standardization")
    v = serde.from_pb(rel.standardization, dtype="<f8", ndim=1, shape=(2 * K + 1,))
    assert np.all(np.isfinite(v)) and np.all(v[K : 2 * K] > 0) and v[-1] > 0
    digest = payload_digest(rel.z.data, rel.noisy_counts.data, rel.standardization.data)
    assert entry.payload_sha256 == rel.payload_sha256 == digest
    # without the statistics the digest is not the entry's: they are bound to it
    assert payload_digest(rel.z.data, rel.noisy_counts.data) != entry.payload_sha256
    # a retry, after the releaser forgot its statistics (as a restarted one has), is the stored
    # release: same statistics, same entry, nothing charged or drawn again
    releaser = p.rs.handlers.releasers[DATASET]
    releaser._standardized.clear()
    head = head_hash(p.remote_entries())
    req = pb.ReleaseBatchesRequest(session_id=resp.session_id, start=0, count=1, ledger_head=head)
    (again,) = list(p.stub.ReleaseBatches(req, timeout=RPC_TIMEOUT))
    assert again.standardization.data == rel.standardization.data
    assert again.z.data == rel.z.data
    assert LedgerEntry.from_json(again.entry_json).body() == entry.body()
    assert len(p.remote_entries()) == before + 1
    # and a restarted releaser reads the stored statistics for the session's rows
    x = releaser.standardized_rows(resp.session_id)
    st = releaser._standardized[resp.session_id][0]
    assert x is not None and np.array_equal(np.concatenate([st.loc, st.scale, [st.clip_norm]]), v)


def test_a_second_release_of_a_standardized_session_is_refused_by_range(
    default_source: Peer,
) -> None:
    p = default_source
    resp = p.open(_standardize())
    head = head_hash(p.remote_entries())
    before = p.snapshot()
    req = pb.ReleaseBatchesRequest(session_id=resp.session_id, start=1, count=1, ledger_head=head)
    with pytest.raises(grpc.RpcError) as e:
        list(p.stub.ReleaseBatches(req, timeout=RPC_TIMEOUT))
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert p.snapshot()[0] == before[0]
