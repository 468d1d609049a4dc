"""The driving party of the public-source deployment: this job's labeled rows are
public, the serving daemon's rows private. The job computes the shared space from its own rows
(``PublicSpace``), opens a reweighting session, asks for the steps in blocks — each one the
holder's DP output, checked against this side's own recomputation of the plan and the charge,
appended to this side's ledger and countersigned — and replays them into the same optimiser
state the holder keeps (``discrepancy.Reweighter``). The weights q then train the model on the
public rows (post-processing): a q-weighted logistic regression for class labels (noisy-fw,
noisy-md), the single-stage method's own linear predictor w for numeric labels."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpda.data.preprocessing import PublicSpace, per_row
from dpda.data.tables import Table
from dpda.dp import discrepancy as D
from dpda.errors import ConfigError
from dpda.public_source_terms import ReweightingTerms, reweighter
from dpda.service.config import TargetConfig
from dpda.target_party.client import GrpcReleaseSource
from dpda.target_party.training import model_pipeline


def reweighting_terms(cfg: TargetConfig) -> ReweightingTerms:
    from dpda.target_party.app import job_delta

    j = cfg.job
    return ReweightingTerms(
        dataset=j.dataset,
        method=j.reweighting_method,
        epsilon=j.epsilon,
        delta=job_delta(cfg),
        steps=j.reweighting_steps,
        representation=j.representation,
    )


def drive(
    source: GrpcReleaseSource,
    terms: ReweightingTerms,
    table: Table,
    space: PublicSpace,
    block: int,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[D.Reweighter, str]:
    """The whole optimisation against the holder; returns the replayed state and the session."""
    y = table.y
    if y is None:
        raise ConfigError(f"{table.where or 'job.data_path'}: the public rows need labels")
    rows = space.map(table.x)
    labels = np.asarray(y, dtype=np.float64) if terms.method == "single-stage" else None
    info = source.open_reweighting(terms, rows, labels, space)
    opt: D.Reweighter = reweighter(terms, rows, labels)
    for start in range(0, terms.steps, block):
        count = min(block, terms.steps - start)
        for output in source.reweight_steps(info, start, count):
            opt.advance(output)
        if progress is not None:
            progress(start + count, terms.steps)
    source.close_session(info.session_id)
    return opt, info.session_id


def run_reweighting_job(
    cfg: TargetConfig,
    source: GrpcReleaseSource,
    table: Table,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, Any], Any]:
    """One public-source job: (results, the fitted model or None for single-stage)."""
    from sklearn.linear_model import LogisticRegression

    job = cfg.job
    terms = reweighting_terms(cfg)
    # the public rows' own space: ``auto`` is their z-score (no release's noise to weigh)
    scaling = "zscore" if job.scaling == "auto" else job.scaling
    space = PublicSpace.of(table.x, job.representation, scaling, job.reweighting_dim)
    t0 = time.perf_counter()
    opt, session_id = drive(source, terms, table, space, job.reweighting_block, progress)
    q = opt.weights()
    seconds = time.perf_counter() - t0
    model = None
    if terms.method != "single-stage":
        assert table.y is not None
        clf = LogisticRegression(max_iter=500)
        xs = space.scaling.apply(per_row(table.x, space.representation))
        clf.fit(xs, table.y, sample_weight=q * q.size)
        model = model_pipeline(space.representation, space.scaling, clf)
    weights_path = cfg.state_dir / "weights.csv"
    with weights_path.open("w") as f:
        f.write("id,weight\n")
        f.writelines(f"{i},{w!r}\n" for i, w in zip(table.ids, q.tolist(), strict=True))
    out = {
        "setting": "public-source",
        "method": terms.method,
        "session_id": session_id,
        "steps": terms.steps,
        "weights": str(weights_path),
        # 1/Σq²: how many of the public rows the weights effectively keep
        "weights_effective_rows": float(1.0 / np.sum(q * q)),
        "predictor": None if model is not None else opt.w.tolist(),
        "job_seconds": seconds,
    }
    return out, model
