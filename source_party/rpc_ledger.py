"""The ledger sync RPCs, source side: ``Countersign`` (the peer's signature on an entry it
received), ``LedgerEntries`` (the entries from a sequence number on, and which of the peer's
still lack its countersignature), and ``RestoreLedger`` (entries this source lost, taken back
from the peer's doubly-signed copy)."""

from __future__ import annotations

import logging

from dpda.dp.ledger import LedgerEntry, head_hash
from dpda.errors import InvalidInput, LedgerCorrupt, PeerMisbehaved
from dpda.service import signing
from dpda.service.crashpoints import crash_point
from dpda.source_party.context import SourceContext


def log_restored(dataset: str, seq: int) -> None:
    logging.getLogger("dpda.source").warning(
        "ledger %s entry %d restored from the peer's countersigned copy", dataset, seq
    )


class LedgerSync:
    def __init__(self, ctx: SourceContext) -> None:
        self.ctx = ctx

    def countersign(self, peer: str, dataset: str, seq: int, target_sig: str) -> None:
        ctx = self.ctx
        with ctx.lock:
            entries = ctx.desk.entries(dataset)
            if not (0 <= seq < len(entries)) or entries[seq].peer != ctx.name(peer):
                raise InvalidInput("no such ledger entry for this peer")
            if not entries[seq].payload_sha256:
                # charged here, but the write that recorded its payload was lost (the peer
                # holds it signed): the peer sends its copy back (RestoreLedger) instead
                raise InvalidInput("this entry has no payload record here: restore it")
            pub = signing.load_public(ctx.peers[peer].signing_public_key)
            if not signing.verify(pub, entries[seq].signed_message(), target_sig):
                raise PeerMisbehaved("countersignature does not verify")
            # the peer countersigned what it received, so it left signed by us: if we lost our
            # signature's write, sign again (Ed25519 is deterministic: the same signature)
            ctx.desk.sign(dataset, seq)
            ctx.desk.ledger.store.update_signatures(dataset, seq, "", "", target_sig)
            crash_point("source.countersign.stored")

    def ledger_entries(
        self, peer: str, dataset: str, since: int
    ) -> tuple[list[str], int, str, list[int]]:
        """(entries from ``since``, the source's length and head, and the seqs of the peer's own
        releases it has not countersigned yet — so that a target that lost a countersignature
        can send it again)."""
        ctx = self.ctx
        if dataset not in ctx.releasers:
            raise InvalidInput("unknown dataset", public=True)
        if since < 0:
            raise InvalidInput("sequence number out of bounds")
        with ctx.lock:
            entries = ctx.desk.entries(dataset)
            pending = ctx.desk.uncountersigned(dataset, ctx.name(peer))
        return [e.to_json() for e in entries[since:]], len(entries), head_hash(entries), pending

    def restore_ledger(self, peer: str, dataset: str, entries_json: list[str]) -> tuple[int, str]:
        """Take back entries this source lost (a truncated tail, a lost WAL) from the peer's
        copy: each must link to our head, carry our own signature and the peer's
        countersignature, and be the peer's own. Nothing is charged or released again; a retried
        request for a restored entry whose payload is gone is refused (it left once)."""
        ctx = self.ctx
        if dataset not in ctx.releasers:
            raise InvalidInput("unknown dataset", public=True)
        name = ctx.name(peer)
        peer_pub = signing.load_public(ctx.peers[peer].signing_public_key)
        own_pub = ctx.desk.key.public_key()
        store = ctx.desk.ledger.store
        with ctx.lock:
            for text in entries_json:
                try:
                    entry = LedgerEntry.from_json(text)
                    # canonical JSON refuses NaN/Infinity (json.loads accepts them); deep nesting
                    # exhausts the recursion limit: both are malformed entries, not internal errors
                    msg = entry.signed_message()
                    sigs = (entry.source_sig, entry.target_sig)
                    if not all(isinstance(sig, str) for sig in sigs):  # null, a number …
                        raise TypeError("signatures are base64 strings")
                except (ValueError, TypeError, RecursionError):
                    raise InvalidInput("a restored entry does not parse") from None
                if entry.dataset != dataset or entry.peer != name:
                    raise PeerMisbehaved("a restored entry is not this peer's")
                if not (
                    signing.verify(own_pub, msg, entry.source_sig)
                    and signing.verify(peer_pub, msg, entry.target_sig)
                ):
                    raise PeerMisbehaved("a restored entry is not signed by both parties")
                mine = store.entries(dataset)
                if entry.seq < len(mine) and mine[entry.seq].entry_hash() == entry.entry_hash():
                    self._complete(mine[entry.seq], entry)  # there; the signatures maybe not
                    continue
                store.append(entry)  # LedgerCorrupt unless it links to our head
                log_restored(dataset, entry.seq)
            entries = store.entries(dataset)
        return len(entries), head_hash(entries)

    def _complete(self, mine: LedgerEntry, theirs: LedgerEntry) -> None:
        """Fill in the payload hash and signatures of an entry we hold incompletely (we lost
        the writes that stored them) from the peer's doubly-signed copy (verified by the
        caller). A field we hold must be the one they hold: else the release was drawn twice."""
        fields = ("payload_sha256", "source_sig", "target_sig")
        if all(getattr(mine, f) == getattr(theirs, f) for f in fields):
            return
        if any(getattr(mine, f) not in ("", getattr(theirs, f)) for f in fields):
            raise LedgerCorrupt("a restored entry conflicts with the one held here")
        self.ctx.desk.ledger.store.update_signatures(
            mine.dataset, mine.seq, theirs.payload_sha256, theirs.source_sig, theirs.target_sig
        )
        log_restored(mine.dataset, mine.seq)
