"""The source's DP standardization of a session (``dpda.dp.preprocessing_dp``), as the
releaser runs it: charged as its own ledger entry, once per session, before the session's
first release and checked together with it; fitted on the session's noise stream only after
that entry is durable; then every release of the session reads the rows standardized, clipped
to the noisy C and divided by it. What it estimated stays on the source's side (``summary``)."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from dpda.dp.events import event_from_json
from dpda.dp.preprocessing_dp import Standardization, fit
from dpda.errors import PolicyRefused
from dpda.protocol import BatchRelease


class SessionPreprocessing:
    """Mixin of ``SourceReleaser``: the preprocessing entry and statistics of each session."""

    def _init_preprocessing(self) -> None:
        self._standardized: dict[str, tuple[Standardization, np.ndarray]] = {}
        self._pre_lock = threading.Lock()
        # what each session's preprocessing estimated, kept after the session closes (the
        # source's own record; DP statistics only)
        self.preprocessing_reports: dict[str, dict[str, Any]] = {}

    def _preprocessing_entry(self, session_id: str) -> Any:
        ours = f"{session_id}/preprocessing"
        for e in self.ledger.store.entries(self.dataset):  # type: ignore[attr-defined]
            if e.session == session_id and e.request_id == ours:
                return e
        return None

    def charge_preprocessing(
        self,
        session_id: str,
        release_event: Any,
        peer: str,
        extra_caps: Sequence[tuple[str, float, Sequence[Any]]],
    ) -> None:
        """Charge the session's preprocessing if it has one and it is not charged yet: both it
        and the release that needs it are checked first (nothing is written if either would
        exceed a cap), then its entry is appended."""
        terms, info = self.session(session_id)  # type: ignore[attr-defined]
        pre = info.plan.preprocessing_spec(terms)
        if pre is None or self._preprocessing_entry(session_id) is not None:
            return
        ledger = self.ledger  # type: ignore[attr-defined]
        prior = [
            event_from_json(e.dp_event)
            for e in ledger.store.entries(self.dataset)  # type: ignore[attr-defined]
            if e.session == session_id
        ]
        caps = [("session", terms.epsilon, prior), *extra_caps]
        ledger.check(self.dataset, [pre.dp_event(), release_event], caps)  # type: ignore[attr-defined]
        ledger.charge(
            dataset=self.dataset,  # type: ignore[attr-defined]
            events=[pre.dp_event()],
            session=session_id,
            peer=peer,
            request_id=f"{session_id}/preprocessing",
            privacy_unit=terms.privacy_unit,
            neighbouring=terms.neighbouring,
            params={
                "preprocessing": pre.to_json(),
                "delta": ledger.budgets[self.dataset].delta,  # type: ignore[attr-defined]
                **self._bound[session_id],  # type: ignore[attr-defined]
            },
            extra_caps=caps,
        )

    def standardized_rows(self, session_id: str) -> np.ndarray | None:
        """The session's rows standardized with its DP statistics (fitted on first use, after
        the charge), or None for a session without preprocessing."""
        terms, info = self.session(session_id)  # type: ignore[attr-defined]
        pre = info.plan.preprocessing_spec(terms)
        if pre is None:
            return None
        with self._pre_lock:
            done = self._standardized.get(session_id)
            if done is not None:
                return done[1]
            entry = self._preprocessing_entry(session_id)
            if entry is None:
                raise PolicyRefused("the session's preprocessing is not charged")
            if entry.payload_sha256:
                # charged and drawn by an earlier process: its noise is spent and not stored,
                # and drawing it again would be a release the ledger does not hold
                raise PolicyRefused(
                    "the session's preprocessing was drawn before a restart: open a new session"
                )
            rng = self._noise[session_id]  # type: ignore[attr-defined]
            st = fit(self.rows(), pre, rng)  # type: ignore[attr-defined]
            x = st.apply(self.rows())  # type: ignore[attr-defined]
            x.setflags(write=False)
            digest = hashlib.sha256(
                np.concatenate([st.loc, st.scale, [st.clip_norm]]).astype("<f8").tobytes()
            ).hexdigest()
            self.ledger.store.update_signatures(  # type: ignore[attr-defined]
                self.dataset,  # type: ignore[attr-defined]
                entry.seq,
                digest,
                "",
                "",
            )
            self._standardized[session_id] = (st, x)
            self.preprocessing_reports[session_id] = {
                "mode": terms.preprocessing,
                "share": pre.share,
                "noise_multiplier": info.plan.preprocessing_noise_multiplier,
                **st.summary(),
            }
            return x

    def with_statistics(self, session_id: str, rel: BatchRelease) -> BatchRelease:
        """The release with the session's DP statistics beside it (post-processing of the
        preprocessing entry's output, sent so that the target can put its rows in the same
        space), or as it is."""
        done = self._standardized.get(session_id)
        if done is None:
            return rel
        st = done[0]
        return replace(rel, standardization=(st.loc.copy(), st.scale.copy(), st.clip_norm))

    def _close_preprocessing(self, session_id: str) -> None:
        self._standardized.pop(session_id, None)
