"""The privacy-budget ledger: check, then commit.

Spend is always derived from the whole list of events of a dataset (all peers, all sessions) with
the dataset's accountant — never a running sum. ``check`` computes the would-be spend with no side
effect and raises ``BudgetExceeded`` before any noise can be drawn; ``append`` durably stores the
entry (hash-chained) and only then may the caller draw noise.

Entries are hash-chained per dataset: ``entry_hash = SHA-256(canonical JSON of every field but
the payload hash and signatures)`` and each entry stores its predecessor's hash (``seq`` counts
within the dataset), so an edited, deleted or reordered entry breaks ``verify_chain``. The
payload hash and the two signatures are added after the entry is durably stored (the entry is
written *before* noise is drawn) and are covered by the signatures instead. Storage is
pluggable (``LedgerStore``): in-memory for the in-process pipeline, SQLite for the daemons
(``ledger_store``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Protocol

from dp_accounting import dp_event

from dpda.dp.accountants import LEDGER_PLD_INTERVAL, Accountant
from dpda.dp.accounting import group_events, ledger_epsilon
from dpda.dp.events import canonical_json, event_from_json, event_to_json
from dpda.errors import BudgetExceeded, ConfigError, LedgerCorrupt

GENESIS = "0" * 64


@dataclass(frozen=True)
class LedgerEntry:
    seq: int
    prev_hash: str
    time: float
    dataset: str
    session: str
    peer: str
    request_id: str
    dp_event: dict[str, Any]
    privacy_unit: str
    neighbouring: str
    params: dict[str, Any]
    spend_after: float
    payload_sha256: str = ""
    source_sig: str = ""
    target_sig: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return canonical_json(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> LedgerEntry:
        import json

        return cls(**json.loads(text))

    def body(self) -> dict[str, Any]:
        """Everything that is hashed and signed (signatures and payload hash excluded)."""
        d = asdict(self)
        for k in ("payload_sha256", "source_sig", "target_sig"):
            d.pop(k)
        return d

    def entry_hash(self) -> str:
        return hashlib.sha256(canonical_json(self.body()).encode()).hexdigest()

    def signed_message(self) -> bytes:
        """What both parties sign: the entry body plus the payload hash."""
        return canonical_json({"body": self.body(), "payload": self.payload_sha256}).encode()


class LedgerStore(Protocol):
    """The contract both stores keep (tests/unit/dp/test_ledger_stores.py runs it on each)."""

    def entries(self, dataset: str | None = None) -> list[LedgerEntry]: ...
    def datasets(self) -> list[str]: ...
    def append(self, entry: LedgerEntry) -> None: ...
    def update_signatures(
        self, dataset: str, seq: int, payload_sha256: str, source_sig: str, target_sig: str
    ) -> None: ...


def head_hash(entries: Sequence[LedgerEntry]) -> str:
    return entries[-1].entry_hash() if entries else GENESIS


class MemoryLedgerStore:
    def __init__(self) -> None:
        self._entries: list[LedgerEntry] = []

    def entries(self, dataset: str | None = None) -> list[LedgerEntry]:
        return [e for e in self._entries if dataset is None or e.dataset == dataset]

    def datasets(self) -> list[str]:
        return sorted({e.dataset for e in self._entries})

    def append(self, entry: LedgerEntry) -> None:
        mine = self.entries(entry.dataset)
        if entry.prev_hash != head_hash(mine) or entry.seq != len(mine):
            raise LedgerCorrupt("ledger head moved: append out of order")
        self._entries.append(entry)

    def update_signatures(
        self, dataset: str, seq: int, payload_sha256: str, source_sig: str, target_sig: str
    ) -> None:
        found = [i for i, e in enumerate(self._entries) if e.dataset == dataset and e.seq == seq]
        if not found:
            raise LedgerCorrupt("no such ledger entry")
        i = found[0]
        e = self._entries[i]
        self._entries[i] = replace(
            e,
            payload_sha256=payload_sha256 or e.payload_sha256,
            source_sig=source_sig or e.source_sig,
            target_sig=target_sig or e.target_sig,
        )


def canonical_events(events: Sequence[dp_event.DpEvent]) -> list[dp_event.DpEvent]:
    """The groups of ``group_events`` as events (``SelfComposedDpEvent`` for repeats)."""
    return [e if n == 1 else dp_event.SelfComposedDpEvent(e, n) for _, e, n in group_events(events)]


def spend_of(events: Sequence[dp_event.DpEvent], delta: float) -> float:
    """The ledger's ε of a list of events at ``delta`` (all of a dataset's, or one cap's)."""
    return ledger_epsilon(group_events(events), delta, LEDGER_PLD_INTERVAL)


@dataclass(frozen=True)
class Budget:
    """A cap on one dataset's ε at its δ. ``owner`` names whose budget it is and the setting
    that holds it, for the refusal (e.g. "the target's own budget for its rows
    (privacy.epsilon_cap)")."""

    epsilon: float
    delta: float
    accountant: str = Accountant.PLD.value
    owner: str = "the dataset's privacy budget"


def default_delta(n_rows: int) -> float:
    """The δ a dataset of ``n_rows`` records gets unless its owner sets one: 1/(10·n), well
    below the 1/n at which one record may be released in the clear."""
    return 1.0 / (10.0 * n_rows)


def check_delta(delta: float, n_rows: int, field: str, rows: str) -> None:
    """Refuse a δ of 1/n or more: a mechanism that releases one of ``n`` records in the clear
    with probability δ satisfies (0, δ)-DP at δ = 1/n, so such a δ protects nothing.
    ``field``: the setting that gave it; ``rows``: whose rows n counts."""
    if not 0 < delta < 1.0 / n_rows:
        raise ConfigError(
            f"{field}: δ = {delta:g} must lie in (0, 1/n) = (0, {1.0 / n_rows:.3g}) for the "
            f"{n_rows} rows of {rows} (at δ ≥ 1/n one record may be released in the clear); "
            f"the default is 1/(10·n) = {default_delta(n_rows):.3g}"
        )


def _exceeded(which: str, cap: float, spent: float, after: float) -> BudgetExceeded:
    """A refusal that says whose budget it is, what the cap is, what it has spent and what the
    release needed: budget numbers only (public to the peer, as ``DescribeDataset`` gives them
    too)."""
    return BudgetExceeded(
        f"{which} would be exceeded: cap ε {cap:.4g}, spent {spent:.4g}, "
        f"remaining {max(cap - spent, 0.0):.4g}, this release needs {after - spent:.4g} "
        f"(ε after it {after:.4g})"
    )


class PrivacyLedger:
    """Per-dataset budget enforcement over a ``LedgerStore``."""

    def __init__(self, store: LedgerStore, budgets: dict[str, Budget]) -> None:
        self.store = store
        self.budgets = dict(budgets)

    def _budget(self, dataset: str) -> Budget:
        try:
            return self.budgets[dataset]
        except KeyError:
            raise BudgetExceeded("no budget is configured for this dataset") from None

    def spent(self, dataset: str) -> float:
        b = self._budget(dataset)
        return spend_of([event_from_json(e.dp_event) for e in self.store.entries(dataset)], b.delta)

    def would_spend(self, dataset: str, new_events: Sequence[dp_event.DpEvent]) -> float:
        """ε of the dataset after adding ``new_events``; no side effect."""
        b = self._budget(dataset)
        events = [event_from_json(e.dp_event) for e in self.store.entries(dataset)]
        return spend_of([*events, *new_events], b.delta)

    def check(
        self,
        dataset: str,
        new_events: Sequence[dp_event.DpEvent],
        extra_caps: Sequence[tuple[str, float, Sequence[dp_event.DpEvent]]] = (),
    ) -> float:
        """Raise ``BudgetExceeded`` if the dataset cap (or any extra cap) would be exceeded.

        ``extra_caps`` holds ``(name, epsilon_cap, prior_events)`` for per-peer or per-session
        caps; their spend is the composition of ``prior_events`` with ``new_events``.
        """
        b = self._budget(dataset)
        after = self.would_spend(dataset, new_events)
        if after > b.epsilon + 1e-12:
            raise _exceeded(b.owner, b.epsilon, self.spent(dataset), after)
        for name, cap, prior in extra_caps:
            e = spend_of([*prior, *new_events], b.delta)
            if e > cap + 1e-12:
                raise _exceeded(f"the {name} privacy budget", cap, spend_of(prior, b.delta), e)
        return after

    def append(
        self,
        *,
        dataset: str,
        session: str,
        peer: str,
        request_id: str,
        events: Sequence[dp_event.DpEvent],
        privacy_unit: str,
        neighbouring: str,
        params: dict[str, Any],
        spend_after: float,
        now: float | None = None,
    ) -> LedgerEntry:
        """Append one entry (the caller has called ``check``); returns the stored entry."""
        mine = self.store.entries(dataset)
        ev = events[0] if len(events) == 1 else dp_event.ComposedDpEvent(list(events))
        entry = LedgerEntry(
            seq=len(mine),
            prev_hash=head_hash(mine),
            time=time.time() if now is None else now,
            dataset=dataset,
            session=session,
            peer=peer,
            request_id=request_id,
            dp_event=event_to_json(ev),
            privacy_unit=privacy_unit,
            neighbouring=neighbouring,
            params=params,
            spend_after=round(spend_after, 12),
        )
        self.store.append(entry)
        return entry

    def charge(
        self, *, dataset: str, events: Sequence[dp_event.DpEvent], **meta: Any
    ) -> LedgerEntry:
        """Check, then commit. Raises before anything is written if a cap would be exceeded."""
        after = self.check(dataset, events, meta.pop("extra_caps", ()))
        return self.append(dataset=dataset, events=events, spend_after=after, **meta)


def verify_chain(entries: Sequence[LedgerEntry]) -> None:
    """Raise ``LedgerCorrupt`` on any edited, deleted, inserted or reordered entry.

    ``entries`` are one dataset's entries in stored order.
    """
    prev = GENESIS
    for i, e in enumerate(entries):
        if e.seq != i:
            raise LedgerCorrupt(f"entry {i}: sequence number out of order")
        if e.prev_hash != prev:
            raise LedgerCorrupt(f"entry {i}: hash chain broken")
        prev = e.entry_hash()


def totals_by_relation(
    entries: Sequence[LedgerEntry], accountant: str = Accountant.PLD.value
) -> dict[str, float | None]:
    """ε of one dataset's entries per neighbouring relation, at the dataset's δ.

    * ``attribute`` (one feature of one record changes): every event composes into it — a
      record-level event also bounds a one-feature change. This is what the caps enforce.
    * ``record`` (one whole record replaced): only record-unit events compose into it. An
      attribute-unit release gives no record-level guarantee at all, so once the dataset has one,
      the record-level ε is unbounded: ``None``. A mixed total is never shown as a record ε.
    """
    if not entries:
        return {"attribute": 0.0, "record": 0.0}
    delta = float(entries[0].params.get("delta", 0.0))
    if not (0 < delta < 1):
        raise LedgerCorrupt("ledger entries do not state the dataset's delta")
    everything = [event_from_json(e.dp_event) for e in entries]
    total = spend_of(everything, delta)
    if any(e.privacy_unit == "attribute" for e in entries):
        return {"attribute": total, "record": None}
    return {"attribute": total, "record": total}
