from __future__ import annotations

import dataclasses

import pytest
from dp_accounting import dp_event

from dpda.dp.accounting import epsilon_of
from dpda.dp.ledger import Budget, MemoryLedgerStore, PrivacyLedger, verify_chain
from dpda.errors import BudgetExceeded, LedgerCorrupt

G = dp_event.GaussianDpEvent(1.5)
L = dp_event.DiscreteLaplaceDpEvent(1.0, 1)


def _ledger(cap: float = 10.0) -> PrivacyLedger:
    return PrivacyLedger(MemoryLedgerStore(), {"d": Budget(cap, 1e-5)})


def _charge(led: PrivacyLedger, rid: str, events=(G, L), **kw):
    return led.charge(
        dataset="d",
        events=list(events),
        session="s",
        peer="p",
        request_id=rid,
        privacy_unit="attribute",
        neighbouring="add-remove",
        params={},
        **kw,
    )


@pytest.mark.slow
def test_spend_is_the_accountant_of_all_events() -> None:
    led = _ledger()
    for i in range(3):
        _charge(led, str(i))
    assert led.spent("d") == pytest.approx(epsilon_of([G, L] * 3, 1e-5), abs=2e-3)
    assert led.store.entries()[-1].spend_after == pytest.approx(led.spent("d"))


def test_check_then_commit_leaves_store_untouched() -> None:
    cap = 1.5 * epsilon_of([G, L], 1e-5)  # room for exactly one charge
    led = _ledger(cap=cap)
    _charge(led, "a")
    before = list(led.store.entries())
    with pytest.raises(BudgetExceeded):
        _charge(led, "b")
    assert led.store.entries() == before  # nothing written by the refused charge
    assert led.spent("d") <= cap


def test_extra_caps_are_enforced() -> None:
    led = _ledger(cap=100)
    with pytest.raises(BudgetExceeded):
        _charge(led, "a", extra_caps=[("peer", 0.5, [])])
    assert led.store.entries() == []


def test_unknown_dataset_refused() -> None:
    with pytest.raises(BudgetExceeded):
        _ledger().check("other", [G])


@pytest.mark.parametrize("tamper", ["edit", "delete", "reorder"])
def test_chain_detects_tampering(tamper: str) -> None:
    led = _ledger()
    for i in range(4):
        _charge(led, str(i))
    entries = led.store.entries()
    verify_chain(entries)
    if tamper == "edit":
        entries[1] = dataclasses.replace(entries[1], spend_after=0.0)
    elif tamper == "delete":
        del entries[1]
    else:
        entries[1], entries[2] = entries[2], entries[1]
    with pytest.raises(LedgerCorrupt):
        verify_chain(entries)


@pytest.mark.slow
def test_a_charge_recomposes_only_what_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    """9ac3bc1: every charge recomposed every distinct event of the dataset, three times
    (0.57 s at 200 events). The running composition is cached by prefix: after 60 distinct
    events, the next charge that repeats the newest one costs a bounded number of PLD
    compositions, with the peer and session caps on the same events reusing the work."""
    from dp_accounting.pld import privacy_loss_distribution as pld

    from dpda.dp.events import RevealedSampledGaussianDpEvent
    from dpda.dp.ledger import spend_of

    led = PrivacyLedger(MemoryLedgerStore(), {"d": Budget(1e6, 1e-5)})
    events = [RevealedSampledGaussianDpEvent(2.0 + 0.01 * i, 0.01) for i in range(60)]
    for i, ev in enumerate(events):
        _charge(led, f"r{i}", events=[ev])
    calls = {"n": 0}
    real = pld.PrivacyLossDistribution.compose

    def counting(self, other, *a, **kw):
        calls["n"] += 1
        return real(self, other, *a, **kw)

    monkeypatch.setattr(pld.PrivacyLossDistribution, "compose", counting)
    prior = [ev for ev in events]
    _charge(led, "again", events=[events[-1]], extra_caps=[("peer", 1e6, prior)])
    assert calls["n"] <= 4, calls  # one step and one fold compose (was 60+ per cap)
    # and the cached value is the one a from-scratch composition gives
    monkeypatch.setattr(pld.PrivacyLossDistribution, "compose", real)
    from dpda.dp.work_bounds import fresh_caches

    with fresh_caches():  # else ε itself comes back from the cache
        fresh = spend_of([*events, events[-1]], 1e-5)
    assert fresh == pytest.approx(led.store.entries()[-1].spend_after, abs=1e-12)


def test_a_budget_refusal_names_whose_budget_and_the_setting_that_holds_it() -> None:
    """The target keeps two budgets in one ledger (its cap for the source's dataset, and its
    own rows'); a refusal says which, so the user knows which setting to change."""
    from dp_accounting import dp_event

    from dpda.dp.ledger import Budget, MemoryLedgerStore, PrivacyLedger
    from dpda.errors import BudgetExceeded
    from dpda.target_party.own_rows import OWN_BUDGET, OWN_ROWS

    ledger = PrivacyLedger(
        MemoryLedgerStore(),
        {OWN_ROWS: Budget(1.0, 1e-5, owner=OWN_BUDGET), "d": Budget(100.0, 1e-5)},
    )
    big = [dp_event.GaussianDpEvent(0.5)]
    with pytest.raises(BudgetExceeded, match=r"^the target's own budget for its rows "
                       r"\(privacy\.epsilon_cap\) would be exceeded: cap ε 1"):  # fmt: skip
        ledger.check(OWN_ROWS, big)
    ledger.check("d", big)  # the other budget, unnamed: the default wording
    with pytest.raises(BudgetExceeded, match=r"^the dataset's privacy budget would be exceeded"):
        PrivacyLedger(MemoryLedgerStore(), {"d": Budget(1.0, 1e-5)}).check("d", big)
