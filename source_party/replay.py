"""Replay or charge: the one path every charged release takes (a batch, a PATE answer, a block
of reweighting steps), so that no request id is ever drawn twice.

1. find the ledger entry of the request id;
2. found, and its payload stored: that payload goes back, uncharged, under the same signature
   — fresh noise for a retry would be a second release;
3. found, signed, and its payload lost: it left before the source lost it, so it is refused
   (a new draw would be a second release);
4. found and never signed: it was charged and never left; it is drawn now, uncharged;
5. not found: the ledger charges it (refusing past a cap), the entry is durable, and only then
   is noise drawn;
6. the payload is stored durably, the entry signed, and the release returned for sending.

What differs between the kinds (how to check a replay, load, charge, draw and store) is a
``ReleaseKind``; the steps and their order are here only.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from dpda.dp.ledger import LedgerEntry
from dpda.errors import LedgerCorrupt
from dpda.protocol import RequestId
from dpda.service.crashpoints import crash_point
from dpda.source_party.ledger_desk import LedgerDesk

P = TypeVar("P")


@dataclass(frozen=True)
class Charged(Generic[P]):
    """A request's entry (charged now, or found charged and never sent) and how to draw its
    payload; ``known`` is how many of the dataset's entries the peer holds, when the kind
    sends the ones it lacks along."""

    seq: int
    draw: Callable[[], P]
    known: int | None = None


@dataclass(frozen=True)
class Released(Generic[P]):
    payload: P
    entry: LedgerEntry  # signed by the source
    catch_up: tuple[LedgerEntry, ...] = ()  # entries before it the peer has not been sent yet


class ReleaseKind(Protocol[P]):
    """One kind of charged release. ``drawn`` and ``stored`` name its crash points; with
    ``draw_unlocked`` the draw runs outside the desk's lock (the caller serialises the
    session)."""

    lost: str  # the refusal when a signed entry's payload is gone
    drawn: str
    stored: str
    draw_unlocked: bool

    @property
    def request_id(self) -> RequestId:
        """The release this request names (its ledger entry's ``request_id`` printed)."""

    def check_replay(self, entry: LedgerEntry) -> None:
        """Refuse a replayed request id whose content differs from the charged one."""

    def load(self, entry: LedgerEntry) -> P | None:
        """The payload stored for ``entry``, or None."""

    def redrawable(self, entry: LedgerEntry) -> bool:
        """Whether an unsigned entry's payload may be drawn now."""

    def redraw(self, entry: LedgerEntry) -> Charged[P]:
        """The draw of an entry charged earlier that never left."""

    def charge(self, entries: list[LedgerEntry]) -> Charged[P]:
        """Charge a new request (``entries``: the dataset's ledger before it)."""

    def store(self, seq: int, payload: P) -> None:
        """Store the payload of the entry at ``seq`` durably."""


def replay_or_charge(desk: LedgerDesk, dataset: str, kind: ReleaseKind[P]) -> Released[P]:
    """The request's payload, signed: the stored one for a replay, else charged (or found
    charged), drawn, stored and signed — steps 1–6 above."""
    request_id = str(kind.request_id)
    with desk.lock:
        entries = desk.entries(dataset)
        existing = next((e for e in entries if e.request_id == request_id), None)
        if existing is not None:
            kind.check_replay(existing)
            stored = kind.load(existing)
            if stored is not None:
                return Released(stored, desk.sign(dataset, existing.seq))
            if existing.source_sig or not kind.redrawable(existing):
                raise LedgerCorrupt(kind.lost, public=True)
            charged = kind.redraw(existing)
        else:
            charged = kind.charge(entries)
        if not kind.draw_unlocked:
            return _store_and_sign(desk, dataset, kind, charged, charged.draw())
    payload = charged.draw()  # after the charge is durable; other releases go on meanwhile
    with desk.lock:
        return _store_and_sign(desk, dataset, kind, charged, payload)


def _store_and_sign(
    desk: LedgerDesk, dataset: str, kind: ReleaseKind[P], charged: Charged[P], payload: P
) -> Released[P]:
    crash_point(kind.drawn)
    kind.store(charged.seq, payload)
    crash_point(kind.stored)
    known = charged.known
    gap = tuple(desk.entries(dataset)[known : charged.seq]) if known is not None else ()
    return Released(payload, desk.sign(dataset, charged.seq), gap)
