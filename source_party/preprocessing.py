"""The source's DP standardization of a session (``dpda.dp.preprocessing_dp``), as the
releaser runs it: charged in the entry of the session's first release, composed with it (one
entry, checked against every cap together, signed, countersigned and synced as every
release's); fitted on the session's noise stream only after that entry is durable, and sent
with that release; then every release of the session reads the rows standardized, clipped to
the noisy C and divided by it. What it estimated stays on the source's side (``summary``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from dpda.dp.preprocessing_dp import Standardization, fit
from dpda.errors import PolicyRefused
from dpda.protocol import BatchRelease, RequestId


class SessionPreprocessing:
    """Mixin of ``SourceReleaser``: the preprocessing statistics of each session."""

    def _init_preprocessing(self) -> None:
        self._standardized: dict[str, tuple[Standardization, np.ndarray]] = {}
        self._pre_lock = threading.Lock()
        # the statistics a first release stored, by its ledger seq (the daemon's store)
        self.stored_statistics: Callable[[int], Standardization | None] | None = None
        # what each session's preprocessing estimated, kept after the session closes (the
        # source's own record; DP statistics only)
        self.preprocessing_reports: dict[str, dict[str, Any]] = {}

    def first_entry(self, session_id: str) -> Any:
        """The ledger entry of the session's first release (which charges its preprocessing),
        or None."""
        ours = str(RequestId.batch(session_id, 0))
        for e in self.ledger.store.entries(self.dataset):  # type: ignore[attr-defined]
            if e.session == session_id and e.request_id == ours:
                return e
        return None

    def standardized_rows(self, session_id: str) -> np.ndarray | None:
        """The session's rows standardized with its DP statistics, or None for a session
        without preprocessing. The statistics are fitted once, on the session's noise stream,
        when its first release (whose entry charges them) is drawn; a release of a session
        whose first one was drawn by an earlier process reads the statistics that release
        stored (``stored_statistics``): they are never drawn twice."""
        terms, info = self.session(session_id)  # type: ignore[attr-defined]
        pre = info.plan.preprocessing_spec(terms)
        if pre is None:
            return None
        with self._pre_lock:
            done = self._standardized.get(session_id)
            if done is not None:
                return done[1]
            entry = self.first_entry(session_id)
            if entry is None:
                raise PolicyRefused("the session's preprocessing is not charged")
            st = None
            if entry.payload_sha256:
                st = self.stored_statistics(entry.seq) if self.stored_statistics else None
                if st is None:
                    # drawn by an earlier process and not stored: drawing it again would be a
                    # release the ledger does not hold
                    raise PolicyRefused(
                        "the session's preprocessing was drawn before a restart and its "
                        "statistics are not stored: open a new session"
                    )
            else:
                rng = self.live(session_id).noise  # type: ignore[attr-defined]
                st = fit(self.rows(), pre, rng)  # type: ignore[attr-defined]
            x = st.apply(self.rows())  # type: ignore[attr-defined]
            x.setflags(write=False)
            self._standardized[session_id] = (st, x)
            self.preprocessing_reports[session_id] = {
                "mode": terms.preprocessing,
                "share": pre.share,
                "noise_multiplier": info.plan.preprocessing_noise_multiplier,
                **st.summary(),
            }
            return x

    def with_statistics(self, session_id: str, rel: BatchRelease) -> BatchRelease:
        """The session's first release with its DP statistics beside it (charged in its entry,
        sent so that the target can put its rows in the same space), or the release as it is."""
        done = self._standardized.get(session_id)
        if done is None or rel.index != 0:
            return rel
        st = done[0]
        return replace(rel, standardization=(st.loc.copy(), st.scale.copy(), st.clip_norm))

    def _close_preprocessing(self, session_id: str) -> None:
        self._standardized.pop(session_id, None)
