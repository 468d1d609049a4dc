"""The source's side of the ledger both parties hold: signing entries, reading how much of the
ledger the peer holds, and the checks a new charge waits for. Every handler that charges or
syncs goes through one ``LedgerDesk``; its lock is the one that makes a charge check atomic."""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any

from dpda.dp.events import event_from_json
from dpda.dp.ledger import LedgerEntry, PrivacyLedger, head_hash
from dpda.errors import LedgerBehind
from dpda.protocol import BatchRelease
from dpda.service import signing
from dpda.service.config import Peer


@dataclass(frozen=True)
class SignedRelease:
    release: BatchRelease
    entry: LedgerEntry  # signed: entry.source_sig
    catch_up: tuple[LedgerEntry, ...] = ()  # entries before it the peer has not been sent yet

    @property
    def source_sig(self) -> str:
        return self.entry.source_sig


class LedgerDesk:
    def __init__(
        self,
        ledger: PrivacyLedger,
        key: signing.Ed25519PrivateKey,
        peers: dict[str, Peer],
        lock: threading.RLock,
    ) -> None:
        self.ledger = ledger
        self.key = key
        self.peers = peers
        self.lock = lock  # one release at a time: the charge check must be atomic

    def entries(self, dataset: str) -> list[LedgerEntry]:
        return self.ledger.store.entries(dataset)

    def sign(self, dataset: str, seq: int) -> LedgerEntry:
        """The entry, signed by the source (signing once; a retry gets the same signature)."""
        entry = self.ledger.store.entries(dataset)[seq]
        if not entry.source_sig:
            sig = signing.sign(self.key, entry.signed_message())
            self.ledger.store.update_signatures(dataset, seq, "", sig, "")
            entry = self.ledger.store.entries(dataset)[seq]
        return entry

    def peer_cap(self, peer: str, dataset: str) -> tuple[str, float, list[Any]]:
        """The peer's cap on ``dataset`` as the ledger checks it: (name, ε cap, the events of
        the peer's entries so far)."""
        name = self.peers[peer].name
        entries = self.ledger.store.entries(dataset)
        prior = [event_from_json(e.dp_event) for e in entries if e.peer == name]
        return "peer", self.peers[peer].epsilon_cap, prior

    def known_prefix(self, dataset: str, ledger_head: str, ledger_length: int) -> int:
        """How many of the dataset's entries the peer holds: its head must be our head, or the
        hash of our entry ``ledger_length - 1`` (it lags because other sessions released
        meanwhile; the entries it lacks travel with the release, ``catch_up``). Anything else:
        sync first."""
        entries = self.ledger.store.entries(dataset)
        if ledger_head == head_hash(entries):
            return len(entries)
        if 0 <= ledger_length <= len(entries) and ledger_head == head_hash(entries[:ledger_length]):
            return ledger_length
        raise LedgerBehind("ledger heads differ: sync the ledger first")

    def with_catch_up(
        self, dataset: str, signed: SignedRelease, known: int
    ) -> tuple[SignedRelease, int]:
        """The release with the entries before it that the peer lacks (it holds ``known``), and
        how many it holds once this one arrives."""
        seq = signed.entry.seq
        if seq <= known:
            return signed, max(known, seq + 1)
        gap = tuple(self.ledger.store.entries(dataset)[known:seq])
        return dataclasses.replace(signed, catch_up=gap), seq + 1

    def require_countersigned(self, dataset: str, name: str, call: set[str]) -> None:
        """A new charge waits until the peer has countersigned every earlier release of its own
        (those of the current call aside): the source never runs ahead of the head the target
        acknowledged (a target that lost a countersignature re-sends it when it syncs)."""
        for e in self.ledger.store.entries(dataset):
            if e.peer == name and e.payload_sha256 and not e.target_sig:
                if e.request_id not in call:
                    raise LedgerBehind("countersign the earlier releases first: sync the ledger")

    def uncountersigned(self, dataset: str, name: str) -> list[int]:
        """The peer's entries we hold without both signatures: sent and not yet countersigned,
        or (after losing writes) held here without a signature they had when they left — the
        peer's doubly-signed copy of those comes back through ``RestoreLedger``. (Entries
        charged and never sent are listed too; the peer, holding them unsigned, skips them.)"""
        return [
            e.seq
            for e in self.ledger.store.entries(dataset)
            if e.peer == name and not (e.source_sig and e.target_sig)
        ]
