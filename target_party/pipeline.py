"""The DPDA job on the target: releases → debiased cost → entropic + group-lasso OT →
barycentric images in the target's own space → a local classifier.

The job takes *a source of releases* behind one small interface (``ReleaseSource``) with two
implementations: the in-process ``SourceReleaser`` and the gRPC client. Everything it computes
from releases is post-processing and costs no budget. This module runs the job; its settings
and the target's view of its rows are in ``view``, the fits in ``fitting``, the PATE and
without-adaptation arms in ``arms``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from dpda.dp.mechanisms import fold_cells
from dpda.errors import ConfigError, PeerMisbehaved, SourceDropped
from dpda.ot.traffic import Traffic
from dpda.protocol import BatchRelease, ReleaseSource, SessionInfo, TargetDisclosure
from dpda.target_party.arms import pate, without_adaptation
from dpda.target_party.compute import Compute
from dpda.target_party.fitting import (
    Fitted,
    JobSession,
    PendingFit,
    release_workspace,
    view_accuracy,
)
from dpda.target_party.forecast import forecast
from dpda.target_party.selection import select
from dpda.target_party.view import AdaptConfig, RowQueries, TargetView, local_space, session_terms
from dpda.terms import SessionTerms

log = logging.getLogger("dpda.target")


@dataclass(frozen=True)
class DPDAResult:
    accuracy: float | None  # of the job's final model (DPDA+PATE > DPDA > PATE student)
    epsilon_spent: float
    delta: float
    noise_multiplier: float
    noise_std: float
    projection_dim: int
    n_batches: int
    rows_received: int
    w_tilde: float  # mean over batches of ⟨γ, C̃⟩ (nan without DPDA releases)
    solver_converged: bool
    predictions: np.ndarray
    mapped: np.ndarray = field(repr=False)
    mapped_labels: np.ndarray = field(repr=False)
    noisy_counts: list[list[int]] = field(default_factory=list, repr=False)
    batch_spend: list[float] = field(default_factory=list, repr=False)
    accuracy_by_method: dict[str, float | None] = field(default_factory=dict)
    pate_queries: int = 0
    model: object = field(default=None, repr=False)  # the job's final classifier
    terms: SessionTerms | None = None  # the terms the session ran under (clip norm chosen)
    session_id: str = ""
    selection: dict[str, Any] = field(default_factory=dict)  # the unsupervised model choice
    # DPDA next to the same release without adaptation (``arms.without_adaptation``)
    adaptation: dict[str, Any] = field(default_factory=dict, repr=False)
    release_seconds: float = 0.0  # wall time of the source's releases (charge + draw + transfer)
    source_seconds: float = 0.0  # wall time of every call to the source (``_TimedSource``)
    # what was transported, in the session's projected space, and the target's rows there
    source_points: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    source_point_labels: np.ndarray = field(
        default_factory=lambda: np.zeros(0, dtype=np.int64), repr=False
    )
    target_projected: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)), repr=False)
    fit_traffic: Traffic = field(default_factory=Traffic)
    # the view the model was fitted in (its scaling and standardization: the saved model's)
    view: TargetView | None = field(default=None, repr=False)
    # what the release was forecast to be worth (``forecast.forecast``: as ``dpda target plan``)
    forecast: dict[str, Any] = field(default_factory=dict)

    def summary(self, asked: SessionTerms) -> dict[str, Any]:
        """The numbers of one run, as ``results.json`` and ``dpda simulate --json`` report them
        (the one place they are named)."""
        ran = self.terms or asked
        return {
            "accuracy": self.accuracy,
            "epsilon_spent": self.epsilon_spent,
            "delta": self.delta,
            "sigma": self.noise_multiplier,
            "noise_std": self.noise_std,
            "projection": asked.projection,
            "projection_dim": self.projection_dim,
            "privacy_unit": asked.privacy_unit,
            "neighbouring": asked.neighbouring,
            "release": asked.release,
            "cells": ran.cells if ran.release == "prototypes" else None,
            "clip_norm": ran.clip_norm if asked.privacy_unit == "record" else None,
            "batches": self.n_batches,
            "rows_received": self.rows_received,
            "w_tilde": self.w_tilde,
            "solver_converged": self.solver_converged,
            "pate_queries": self.pate_queries,
            "accuracy_by_method": self.accuracy_by_method,
            "reg_e": self.selection.get("reg_e"),
            "reg_g": self.selection.get("reg_g"),
            "selection": self.selection,
            "adaptation": {k: v for k, v in self.adaptation.items() if k != "predictions"},
            "caveat": ran.caveat,
        }


def _open(
    source: ReleaseSource,
    view: TargetView,
    terms: SessionTerms,
    cfg: AdaptConfig,
    compute: Compute | None = None,
    source_rows: tuple[int, int] | None = None,
) -> JobSession:
    terms, basis = session_terms(view, terms, cfg, source_rows)
    if terms.source_space:
        info = source.open_session(terms, TargetDisclosure(None, None))
        if info.projection.shape[0] != view.x.shape[1]:
            raise PeerMisbehaved(
                f"the source has {info.projection.shape[0]} features, the target {view.x.shape[1]}"
            )
        space, xt_proj = local_space(view, terms.clip_norm, terms.projection_dim)
        return JobSession(
            source, view, terms, cfg, info, xt_proj, compute or Compute(), space=space
        )
    info = source.open_session(terms, TargetDisclosure(view.scaling, basis))
    xt_proj = view.x @ info.projection
    return JobSession(source, view, terms, cfg, info, xt_proj, compute or Compute())


def _release_all(
    s: JobSession, spent: Callable[[], float], progress: Callable[[int, int], None] | None
) -> Fitted:
    out = Fitted(aggregate=s.terms.release != "rows")
    steps = s.info.plan.steps
    pending: list[PendingFit] = []
    if s.info.plan.is_metric(steps):  # the learned cost first: every fit below uses it
        t0 = time.perf_counter()
        s.metric = s.source.release(s.info.session_id, steps).z
        out.release_seconds += time.perf_counter() - t0
        out.spend.append(spent())
    dropped: SourceDropped | None = None
    for i in range(steps):
        t0 = time.perf_counter()
        try:
            rel = s.source.release(s.info.session_id, i)
        except SourceDropped as exc:  # one source of several: the job goes on with the others
            out.release_seconds += time.perf_counter() - t0
            log.warning("%s; the job goes on with the other sources' releases", exc)
            dropped = exc
            if progress:
                progress(i + 1, steps)
            continue
        out.release_seconds += time.perf_counter() - t0
        if not out.releases and rel.standardization is not None and s.space is not None:
            # the source's DP statistics came with the release: the target's rows move into
            # the same standardized space, and its OT space with them
            s.view = s.view.adopt(*rel.standardization)
            s.space, s.xt_proj = local_space(s.view, s.terms.clip_norm, s.terms.projection_dim)
        out.releases.append(rel)
        # in-process: fitted now; on Dask: a task, while this process asks for the next release
        pending.append(s.submit(rel, s.view))
        out.counts.append([int(c) for c in fold_cells(rel.noisy_counts, s.info.n_classes)])
        if i + 1 < steps:  # the last one is read after training: its charge check and
            out.spend.append(spent())  # countersignature run meanwhile, in the background
        if progress:
            progress(i + 1, steps)
    if dropped is not None and not out.releases:
        raise SourceDropped(f"every source left the job; the last: {dropped}")
    out.fits = s.collect(pending)
    return out


def run_dpda(
    source: ReleaseSource,
    view: TargetView,
    terms: SessionTerms,
    cfg: AdaptConfig,
    spent: Callable[[], float],
    progress: Callable[[int, int], None] | None = None,
    row_queries: RowQueries | None = None,
    compute: Compute | None = None,
    source_rows: tuple[int, int] | None = None,
) -> DPDAResult:
    """Run one job against ``source``; ``spent()`` reads ε from the target's ledger;
    ``row_queries``: what PATE may send about the target's rows; ``source_rows``: the
    source's published (rows, classes), which a job's ``cells`` follow (``session_terms``).

    DPDA releases (``terms.dpda``) → OT → mapped source rows. With PATE (``terms.pate_queries``):
    alone, the teachers label random target rows and a student is trained on them; with DPDA,
    they label the target rows least certain under the plan, which then forbid mass from source
    rows of other classes in a second solve on the *same* releases (post-processing, no budget).
    """
    if cfg.target_batch and terms.pate_queries:  # checked before anything is spent
        raise ConfigError("target_batch: target-side minibatches are not combined with PATE yet")
    timed = _TimedSource(source, spent)
    source, spent = timed, timed.spent
    try:
        s = _open(source, view, terms, cfg, compute, source_rows)
        del view  # the session holds it: a view it replaces (``TargetView.adopt``) is freed
        done = _release_all(s, spent, progress)
        # the view the fits ran in: the source's DP standardization, when one came with the
        # first release, moved the target's rows (``TargetView.adopt``)
        view = s.view
        by_method: dict[str, float | None] = {}
        selection: dict[str, Any] = {}
        adaptation: dict[str, Any] = {}
        if done.fits:
            selection = select(s, done, view)  # may change s.cfg and done.fits
            done.train(view, s.cfg)
            by_method["dpda"] = view_accuracy(done.pred, view) if done.pred is not None else None
            adaptation = without_adaptation(s, done, by_method)
            if s.cfg.keep == "better":
                from dpda.target_party.choice import choose
                from dpda.target_party.consortium import pooled_job

                # several sources still in the job: the pooled release votes too
                picked = choose(s, done, pooled=pooled_job(timed.inner))
                adaptation["choice"] = picked
                adaptation["kept"] = "dpda" if picked["kept_adapts"] else "dp_no_adaptation"
                adaptation["kept_arm"] = picked["kept"]
                assert done.pred is not None
                adaptation["kept_accuracy"] = view_accuracy(done.pred, view)
                adaptation["agreement"] = float(np.mean(adaptation["predictions"] == done.pred))
            done.spend.append(spent())  # before any PATE answer is charged
        if s.info.plan.pate_queries > 0:
            pate(s, done, by_method, row_queries or RowQueries())
        source.close_session(s.info.session_id)
        out = _result(s, done, by_method, spent(), selection)
        return replace(out, source_seconds=timed.seconds, adaptation=adaptation)
    finally:
        release_workspace()  # this thread's solver buffers: the job's fits are done


class _TimedSource:
    """The job's source, the wall time of each call summed (``DPDAResult.source_seconds``):
    what the job spends on the source — asking it, and through ``spent`` waiting for its
    charges to be checked. The rest of a job is the target's own compute, the same
    arithmetic in-process and through the daemons (``dpda bench service`` reports the two
    apart; in-process, the rest also holds setting up the view and the releaser)."""

    def __init__(self, source: ReleaseSource, spent: Callable[[], float]) -> None:
        self.inner, self._spent, self.seconds = source, spent, 0.0

    def _timed(self, fn: Callable[..., Any], *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.seconds += time.perf_counter() - t0

    def open_session(
        self, terms: SessionTerms, disclosure: TargetDisclosure, session_id: str | None = None
    ) -> SessionInfo:
        return self._timed(self.inner.open_session, terms, disclosure, session_id)

    def release(self, session_id: str, index: int, peer: str | None = None) -> BatchRelease:
        if peer is None:  # each source's own default
            return self._timed(self.inner.release, session_id, index)
        return self._timed(self.inner.release, session_id, index, peer)

    def query_teachers(self, session_id: str, index: int, queries: np.ndarray) -> np.ndarray:
        return self._timed(self.inner.query_teachers, session_id, index, queries)

    def close_session(self, session_id: str) -> None:
        self._timed(self.inner.close_session, session_id)

    def spent(self) -> float:
        return float(self._timed(self._spent))


def _result(
    s: JobSession,
    done: Fitted,
    by_method: dict[str, float | None],
    epsilon_spent: float,
    selection: dict[str, Any],
) -> DPDAResult:
    view, fits = s.view, done.fits
    pred = done.pred if done.pred is not None else np.zeros(view.x.shape[0], dtype=np.int64)
    spec = s.info.plan.spec(s.terms)
    return DPDAResult(
        accuracy=view_accuracy(pred, view),
        epsilon_spent=epsilon_spent,
        delta=s.terms.delta,
        noise_multiplier=spec.features.noise_multiplier,
        noise_std=spec.features.noise_std,
        projection_dim=s.xt_proj.shape[1],
        n_batches=s.info.plan.steps,
        rows_received=int(sum(r.z.shape[0] for r in done.releases)),
        w_tilde=float(np.mean([f.w_tilde for f in fits])) if fits else float("nan"),
        solver_converged=all(f.converged for f in fits),
        predictions=pred,
        mapped=done.mapped if done.mapped is not None else np.zeros((0, view.x.shape[1])),
        mapped_labels=(
            done.mapped_labels if done.mapped_labels is not None else np.zeros(0, dtype=np.int64)
        ),
        noisy_counts=done.counts,
        batch_spend=done.spend,
        release_seconds=done.release_seconds,
        source_points=(
            np.vstack([f.points for f in fits]) if fits else np.zeros((0, s.xt_proj.shape[1]))
        ),
        source_point_labels=(
            np.concatenate([f.labels for f in fits]) if fits else np.zeros(0, dtype=np.int64)
        ),
        target_projected=s.xt_proj,
        accuracy_by_method=by_method,
        pate_queries=s.info.plan.pate_queries,
        model=done.model,
        terms=s.terms,
        session_id=s.info.session_id,
        selection=selection,
        fit_traffic=sum((f.traffic for f in fits), Traffic()),
        view=view,
        forecast=forecast(s.terms, s.info.plan, s.info.n_rows, s.info.n_classes, view.x.shape[0]),
    )
