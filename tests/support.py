"""Shared test setup (issue 14): the in-memory ledger and the source's releaser over it, which
unit and privacy tests used to build by hand in a dozen places."""

from __future__ import annotations

from typing import Any

import numpy as np

from dpda.data.loaders import Domain
from dpda.dp.ledger import Budget, MemoryLedgerStore, PrivacyLedger
from dpda.source_party.releases import SourceReleaser


def memory_ledger(dataset: str, budget: Budget) -> PrivacyLedger:
    return PrivacyLedger(MemoryLedgerStore(), {dataset: budget})


def memory_releaser(
    domain: Domain,
    dataset: str,
    budget: Budget,
    rng: np.random.Generator | None = None,
    **kw: Any,
) -> tuple[SourceReleaser, PrivacyLedger]:
    """A ``SourceReleaser`` for ``domain`` as ``dataset`` and its in-memory ledger."""
    ledger = memory_ledger(dataset, budget)
    gen = rng if rng is not None else np.random.default_rng(0)
    return SourceReleaser(domain, dataset, ledger, gen, **kw), ledger
