"""The job's arms beside DPDA, on the same session: PATE labels for target rows (asked of the
source's teachers as the target's row-query policy allows) and the same release used without
adaptation (the job's label-free choice among these and its other arms: ``choice``)."""

from __future__ import annotations

import numpy as np

from dpda.errors import ConfigError
from dpda.protocol import ReleaseSource
from dpda.target_party.fitting import Fitted, JobSession, view_accuracy
from dpda.target_party.training import fit_predict
from dpda.target_party.view import RowQueries, TargetView


def select_rows(class_mass: np.ndarray, k: int, how: str, seed: int) -> np.ndarray:
    """``k`` target rows: least (``uncertain``) or most (``confident``) certain under the plan's
    class shares, or ``random``."""
    share = class_mass / np.maximum(class_mass.sum(axis=0, keepdims=True), 1e-300)
    certainty = share.max(axis=0)
    if how == "uncertain":
        return np.argsort(certainty, kind="stable")[:k]
    if how == "confident":
        return np.argsort(-certainty, kind="stable")[:k]
    if how == "random":
        return np.random.default_rng(seed).choice(class_mass.shape[1], k, replace=False)
    raise ValueError(f"unknown selection {how!r}")


def ask_teachers(source: ReleaseSource, session_id: str, queries: np.ndarray) -> np.ndarray:
    """PATE labels for ``queries``, asked in chunks that fit the source's request limit (one
    request id per chunk; each chunk is charged for its own queries)."""
    from dpda.service.serde import MAX_REQUEST_BYTES

    rows = max(1, (MAX_REQUEST_BYTES // 2) // (8 * max(1, queries.shape[1])))
    parts = [
        source.query_teachers(session_id, j, queries[start : start + rows])
        for j, start in enumerate(range(0, queries.shape[0], rows))
    ]
    return np.concatenate(parts)


def _query_variances(s: JobSession, rq: RowQueries) -> np.ndarray:
    """The variances of the projected target rows along each direction, for synthetic queries,
    from released or public values only: the DP ones of the disclosure; else (a JL projection,
    or exact disclosures, which do not send the eigenvalues) the unit variance of the scaled
    columns through the public projection."""
    ell = s.xt_proj.shape[1]
    if rq.variances is not None and rq.variances.size >= ell:
        return np.asarray(rq.variances[:ell])
    return np.asarray(np.sum(s.info.projection**2, axis=0))


def _pate_labels(s: JobSession, idx: np.ndarray, rq: RowQueries, seed: int) -> np.ndarray:
    """Labels for the target rows ``idx`` under the target's row-query policy ``rq``."""
    space = s.xt_proj if s.terms.pate_space == "projected" else s.view.x
    sid = s.info.session_id
    if rq.mode == "exact":
        return ask_teachers(s.source, sid, np.ascontiguousarray(space[idx]))
    if s.terms.pate_space != "projected":
        raise ConfigError(f"privacy.row_queries: {rq.mode} queries are projected; pate_space raw")
    if rq.mode == "dp":
        if rq.protect is None:
            raise ConfigError("privacy.row_queries: dp needs the target's own ledger")
        sent = rq.protect(sid, np.ascontiguousarray(space[idx]), float(s.terms.clip_norm))
        return ask_teachers(s.source, sid, np.ascontiguousarray(sent))
    if rq.mode == "synthetic":
        from dpda.dp.target_disclosure import synthetic_queries

        pts = synthetic_queries(_query_variances(s, rq), idx.size, np.random.default_rng([seed, 7]))
        if rq.record is not None:
            pts = rq.record(sid, pts)
        answers = ask_teachers(s.source, sid, np.ascontiguousarray(pts))
        _, pred = fit_predict(pts, answers, space, s.cfg.classifier, seed)
        return np.asarray(pred, dtype=np.int64)[idx]
    raise ConfigError(f"privacy.row_queries: {rq.mode!r} is not exact, dp or synthetic")


def pate(s: JobSession, done: Fitted, by_method: dict[str, float | None], rq: RowQueries) -> None:
    """Label ``pate_queries`` target rows through the teachers, as ``rq`` allows; with DPDA,
    re-fit the same releases with those labels as known (post-processing), else train a student
    on them. Under ``dp`` the rows are drawn at random (a choice by the plan would depend on
    every target row); otherwise the plan picks them (``cfg.pate_select``)."""
    view, cfg, terms, fits = s.view, s.cfg, s.terms, done.fits
    n_q = s.info.plan.pate_queries
    if fits and rq.mode != "dp":
        mass = np.sum([f.class_mass for f in fits], axis=0)
        idx = select_rows(mass, n_q, cfg.pate_select, cfg.seed)
    else:
        idx = np.random.default_rng(cfg.seed).choice(view.x.shape[0], n_q, replace=False)
    backs = [f.back_mapped for f in fits if f.back_mapped is not None]
    if (
        fits
        and len(backs) == len(fits)
        and rq.mode == "exact"
        and cfg.pate_query == "backmapped"
        and terms.pate_space == "projected"
    ):
        queries = (np.sum(backs, axis=0) / len(backs))[idx]
        labels = ask_teachers(s.source, s.info.session_id, np.ascontiguousarray(queries))
    else:
        labels = _pate_labels(s, idx, rq, cfg.seed)
    known = view.known.copy()
    if fits and cfg.pate_agree:
        plan_class = np.argmax(sum(f.class_mass for f in fits), axis=0)[idx]
        keep = labels == plan_class
        idx, labels = idx[keep], labels[keep]
    known[idx] = labels
    labeled = TargetView(view.x, view.scaling, view.labels, known, view.disclosure)
    if fits:
        done.fits = s.fit_all(done.releases, labeled)
        done.train(labeled, cfg)
        by_method["dpda_pate"] = view_accuracy(done.pred, view) if done.pred is not None else None
    elif idx.size:
        done.model, done.pred = fit_predict(view.x[idx], labels, view.x, cfg.classifier, cfg.seed)
        by_method["pate"] = view_accuracy(done.pred, view)


def without_adaptation(s: JobSession, done: Fitted, by_method: dict[str, float | None]) -> dict:
    """The same release used without adaptation: a nearest-class-mean classifier whose class
    means are the release's own (in the OT space, then lifted into the target's space so the
    saved model reads raw rows), next to DPDA; both scored by the label-free cluster estimate
    (``selection.cluster_score``), reported; with ``keep = "better"`` the choice among every
    arm is ``choice.choose``'s. Post-processing of one release: no budget."""
    from sklearn.neighbors import KNeighborsClassifier

    from dpda.target_party.selection import cluster_score

    pts = np.vstack([f.points for f in done.fits])
    labels = np.concatenate([f.labels for f in done.fits])
    w = np.concatenate([f.weights for f in done.fits])
    width = s.xt_proj.shape[1]
    pts = pts[:, :width]
    classes = np.unique(labels)
    means = np.vstack(
        [np.average(pts[labels == c], axis=0, weights=w[labels == c] + 1e-300) for c in classes]
    )
    to_ot = s.space.basis if s.space is not None else s.info.projection
    centres = means @ np.linalg.pinv(to_ot)
    model = KNeighborsClassifier(n_neighbors=1).fit(centres, classes)
    pred = np.asarray(model.predict(s.view.x))
    by_method["dp_no_adaptation"] = view_accuracy(pred, s.view)
    assert done.pred is not None
    scores = {
        "dpda": cluster_score(s.xt_proj, done.pred, s.cfg.seed),
        "dp_no_adaptation": cluster_score(s.xt_proj, pred, s.cfg.seed),
    }
    agree = float(np.mean(pred == done.pred))
    return {
        "estimate": scores,
        "estimate_method": "silhouette",
        "kept": "dpda",  # ``choice.choose`` decides under keep = "better"
        "kept_accuracy": by_method.get("dpda"),
        "rule": s.cfg.keep,
        "agreement": agree,
        "predictions": pred,
    }
