"""Several private sources for one target: each source's releases as batches of one job.

A consortium job opens one session at each source under the same terms. Each source plans,
charges and audits its own session against its own ledger and policy, exactly as for a job of
its own; nothing one source sends changes what another charges. The target takes every
source's releases as the batches of one job: each release is transported onto the target's
rows by its own fit, and the classifier trains on the union of what the fits map (the way a
job's minibatches are combined). The same releases, pooled, are the job's release without
adaptation, so the label-free choice weighs adapting against not adapting on all of them; and
the sources' class images, averaged class by class, vote as adapted arms of their own (where
one source's shift puts its image of a class astray, the average follows the sources that
agree: ``choice._pooled_images``).

A source that refuses the session or fails to open it leaves the job with the others, and
the job says which one is missing (``missing``); with none left, the job stops. A source that
fails while the job asks it for a release (refused, unreachable, or a release that does not
verify) is dropped the same way: its releases are skipped (``SourceDropped``), the job goes on
with the others', and what that source charged stays on its own ledger, charged once (the
target asks no source for another's release, and never asks again for one it was refused).

The sources' ε are their own: a record belongs to one source, so each source's guarantee is
its own session's spend (``spent_by_source``), and no source's charge depends on another's
release.

Offered for whole-dataset aggregate releases in the source's own space without DP
preprocessing (each source's DP standardization would put its points in a space of its own)
and without PATE queries; other terms are refused before any session opens.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from dpda.errors import ConfigError, DpdaError, SourceDropped
from dpda.protocol import BatchRelease, ReleaseSource, SessionInfo, TargetDisclosure
from dpda.terms import SessionTerms

log = logging.getLogger("dpda.target")


def check_consortium_terms(terms: SessionTerms) -> None:
    """Refuse, before anything opens, the terms a consortium job does not combine."""
    if not terms.source_space:
        raise ConfigError(
            "several sources: offered for releases in the source's own space (prototypes, "
            "class-gaussians with --projection source)"
        )
    if terms.pate_queries:
        raise ConfigError("several sources: PATE queries are not combined across sources")
    if terms.preprocessing == "standardize":
        raise ConfigError(
            "several sources: each source's DP standardization is a space of its own; use a "
            "per-row representation with a natural bound (representation sqrt, rownorm or l2)"
        )


class Consortium:
    """A ``ReleaseSource`` over several named sources: one session at each, their releases
    numbered one after another as the batches of one job.

    Parameters
    ----------
    sources : mapping of str to ReleaseSource
        Each source by the name the report gives it.
    spent : mapping of str to callable
        Each source's ε spent so far, as that source's ledger (or the target's copy of it)
        reads it.
    """

    def __init__(
        self, sources: Mapping[str, ReleaseSource], spent: Mapping[str, Callable[[], float]]
    ) -> None:
        if len(sources) < 2:
            raise ConfigError("a consortium job needs at least two sources")
        self.sources = dict(sources)
        self._spent = dict(spent)
        self.sessions: dict[str, SessionInfo] = {}
        self.missing: dict[str, str] = {}  # source → why it is not in the job
        self.delivered: set[str] = set()  # the sources of at least one release the job holds
        self._index: list[tuple[str, int]] = []  # global release index → (source, its index)

    def open_session(
        self, terms: SessionTerms, disclosure: TargetDisclosure, session_id: str | None = None
    ) -> SessionInfo:
        check_consortium_terms(terms)
        for name, source in self.sources.items():
            try:
                self.sessions[name] = source.open_session(terms, disclosure)
            except DpdaError as exc:  # refused or unreachable: the job goes on without it
                self.missing[name] = f"{type(exc).__name__}: {exc}"
        if not self.sessions:
            raise ConfigError(
                "no source opened a session: "
                + "; ".join(f"{n}: {why}" for n, why in self.missing.items())
            )
        infos = list(self.sessions.values())
        features = {i.n_features for i in infos}
        if len(features) > 1:
            raise ConfigError(f"the sources hold different numbers of features: {features}")
        for name, info in self.sessions.items():
            self._index += [(name, i) for i in range(info.plan.steps)]
        first = infos[0]
        return SessionInfo(
            session_id="+".join(i.session_id for i in infos),
            n_rows=sum(i.n_rows for i in infos),
            n_features=first.n_features,
            n_classes=max(i.n_classes for i in infos),
            projection=first.projection,
            plan=first.plan.model_copy(update={"steps": len(self._index)}),
        )

    def release(self, session_id: str, index: int, peer: str | None = None) -> BatchRelease:
        """The job's batch ``index``: its source's release. Raises ``SourceDropped`` when that
        source has failed (now or earlier in the job): the job skips the batch."""
        name, local = self._index[index]
        if name in self.missing:
            raise SourceDropped(f"source {name!r} left the job: {self.missing[name]}")
        sid = self.sessions[name].session_id
        try:
            rel = self.sources[name].release(sid, local)
        except DpdaError as exc:
            self.missing[name] = f"failed at its release {local}: {type(exc).__name__}: {exc}"
            raise SourceDropped(f"source {name!r} left the job: {self.missing[name]}") from exc
        self.delivered.add(name)
        return replace(rel, index=index)

    def query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray:
        raise ConfigError("several sources: PATE queries are not combined across sources")

    def close_session(self, session_id: str) -> None:
        """Close every source's session; a dropped source's close is tried, and its failure
        only logged."""
        for name, info in self.sessions.items():
            try:
                self.sources[name].close_session(info.session_id)
            except DpdaError as exc:
                if name not in self.missing:
                    raise
                log.warning("closing the session of dropped source %r: %s", name, exc)

    def in_job(self) -> list[str]:
        """The sources whose releases the job holds: each one that delivered a release, a
        source dropped after it did included."""
        return [name for name in self.sessions if name in self.delivered]

    def source_of(self, index: int) -> str:
        """The source whose release is the job's batch ``index``."""
        return self._index[index][0]

    def spent_by_source(self) -> dict[str, float]:
        """Each source's ε spent (a source that did not open: what its ledger holds, 0 for a
        fresh one)."""
        return {name: float(read()) for name, read in self._spent.items()}

    def spent(self) -> float:
        """The largest of the sources' spends: a record belongs to one source, so this is what
        the job spends of any one record's budget."""
        return max(self.spent_by_source().values())

    def report(self) -> dict[str, Any]:
        """What the job's report says of its sources."""
        return {
            "sources": list(self.sources),
            "opened": list(self.sessions),
            "missing": dict(self.missing),
            "epsilon_spent_by_source": self.spent_by_source(),
        }


def pooled_job(source: object) -> bool:
    """Whether a job's releases come from several sources (a ``Consortium`` with two or more
    of them in the job): its label-free choice then lets the pooled release vote."""
    return isinstance(source, Consortium) and len(source.in_job()) > 1
