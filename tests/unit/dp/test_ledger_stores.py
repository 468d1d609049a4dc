"""One contract, both ledger stores (issue 14): the in-memory store the in-process job uses and
the SQLite store the daemons use must answer every call the same way, refusals included."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from dp_accounting import dp_event

from dpda.dp.ledger import Budget, LedgerEntry, LedgerStore, MemoryLedgerStore, PrivacyLedger
from dpda.dp.ledger import head_hash as head
from dpda.errors import LedgerCorrupt
from dpda.service.ledger_store import SqliteLedgerStore

STORES: dict[str, Callable[[Path], LedgerStore]] = {
    "memory": lambda _: MemoryLedgerStore(),
    "sqlite": lambda tmp: SqliteLedgerStore(tmp / "state.sqlite"),
}


@pytest.fixture(params=sorted(STORES))
def store(request: pytest.FixtureRequest, tmp_path: Path) -> LedgerStore:
    return STORES[request.param](tmp_path)


def _entry(store: LedgerStore, dataset: str, rid: str, spend: float = 1.0) -> LedgerEntry:
    mine = store.entries(dataset)
    return LedgerEntry(
        seq=len(mine),
        prev_hash=head(mine),
        time=1.0,
        dataset=dataset,
        session="s",
        peer="p",
        request_id=rid,
        dp_event={"type": "GaussianDpEvent", "noise_multiplier": 1.0},
        privacy_unit="record",
        neighbouring="replace-one",
        params={"delta": 1e-5},
        spend_after=spend,
    )


def test_empty(store: LedgerStore) -> None:
    assert store.entries() == [] and store.entries("d") == [] and store.datasets() == []


def test_appends_chain_per_dataset(store: LedgerStore) -> None:
    for i, ds in enumerate(["b", "a", "b", "a", "a"]):
        store.append(_entry(store, ds, f"r{i}"))
    assert [e.request_id for e in store.entries("a")] == ["r1", "r3", "r4"]
    assert [e.seq for e in store.entries("b")] == [0, 1]
    assert store.datasets() == ["a", "b"]
    assert sorted(e.request_id for e in store.entries()) == ["r0", "r1", "r2", "r3", "r4"]
    a = store.entries("a")
    assert all(e.prev_hash == head(a[:i]) for i, e in enumerate(a))


@pytest.mark.parametrize("fault", ["seq", "prev_hash"])
def test_an_out_of_order_append_is_refused_and_changes_nothing(
    store: LedgerStore, fault: str
) -> None:
    store.append(_entry(store, "d", "r0"))
    good = _entry(store, "d", "r1")
    bad = replace(good, seq=5) if fault == "seq" else replace(good, prev_hash="0" * 64)
    with pytest.raises(LedgerCorrupt):
        store.append(bad)
    assert [e.request_id for e in store.entries("d")] == ["r0"]
    store.append(good)  # the honest next entry still fits
    assert len(store.entries("d")) == 2


def test_signatures_are_set_once_each_and_leave_the_body_alone(store: LedgerStore) -> None:
    store.append(_entry(store, "d", "r0"))
    before = store.entries("d")[0]
    store.update_signatures("d", 0, "ab" * 32, "S", "")
    store.update_signatures("d", 0, "", "", "T")
    after = store.entries("d")[0]
    assert (after.payload_sha256, after.source_sig, after.target_sig) == ("ab" * 32, "S", "T")
    assert after.body() == before.body() and after.entry_hash() == before.entry_hash()
    store.append(_entry(store, "d", "r1"))  # the chain still links after the update


def test_signing_an_unknown_entry_is_refused(store: LedgerStore) -> None:
    store.append(_entry(store, "d", "r0"))
    for ds, seq in (("d", 1), ("x", 0)):
        with pytest.raises(LedgerCorrupt):
            store.update_signatures(ds, seq, "", "S", "")
    assert store.entries("d")[0].source_sig == ""


def test_the_ledger_charges_the_same_over_either_store(store: LedgerStore) -> None:
    ledger = PrivacyLedger(store, {"d": Budget(8.0, 1e-5)})
    events = [dp_event.GaussianDpEvent(2.0)]
    spends = []
    for i in range(3):
        meta = {"session": "s", "peer": "p", "request_id": f"r{i}", "privacy_unit": "record"}
        entry = ledger.charge(
            dataset="d", events=events, neighbouring="replace-one", params={}, **meta
        )
        spends.append(entry.spend_after)
    assert spends == sorted(spends) and ledger.spent("d") == pytest.approx(spends[-1])
    with pytest.raises(Exception, match="budget"):
        for i in range(3, 50):
            ledger.charge(
                dataset="d",
                events=events,
                session="s",
                peer="p",
                request_id=f"r{i}",
                privacy_unit="record",
                neighbouring="replace-one",
                params={},
            )
    assert ledger.spent("d") <= 8.0 + 1e-12
