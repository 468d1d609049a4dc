"""Composition root of the target: config → its own ledger and audit log → gRPC peer → the
DPDA job → results on disk (``state_dir/results.json``, the model as one pipeline on raw rows in
``state_dir/model.skops``, the predictions with the rows' ids)."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from dpda.data.loaders import load_domain
from dpda.data.preprocessing import check_representation
from dpda.data.synthetic import two_domains
from dpda.data.tables import Table, read_table, write_predictions
from dpda.dp.events import event_from_json
from dpda.dp.ledger import Budget, PrivacyLedger, spend_of
from dpda.errors import ConfigError
from dpda.service import signing
from dpda.service.audit import AuditLog
from dpda.service.config import TargetConfig
from dpda.service.ledger_store import SqliteLedgerStore, connect
from dpda.service.progress import Progress
from dpda.target_party.client import GrpcReleaseSource
from dpda.target_party.pipeline import AdaptConfig, run_dpda, target_view
from dpda.target_party.report import figures_of
from dpda.target_party.training import model_pipeline, save_model
from dpda.terms import SessionTerms

log = logging.getLogger("dpda.target")


def load_target_data(cfg: TargetConfig) -> Table:
    """The target's rows (labels only if the job names a label column the table has) and the
    ids its predictions are written with."""
    job = cfg.job
    if job.data_kind == "synthetic":
        # the reverse deployment's driver holds the (public, labeled) synthetic source
        d = two_domains(*job.synthetic_rows)[0 if job.setting == "public-source" else 1]
    elif job.data_path is None:
        raise ConfigError("job.data_path: required for this data_kind")
    elif job.data_kind == "table":
        return read_table(
            job.data_path, job.label_column, labels="optional", id_column=job.id_column
        )
    else:
        d = load_domain(job.data_path, job.data_kind, job.domain)
    return Table.of(d)


# the session terms a target job sets ([job] in its config); the rest keep SessionTerms' defaults
_TERMS_FROM_JOB = (
    "dataset", "epsilon", "delta", "privacy_unit", "neighbouring", "projection",
    "projection_dim", "batch_size", "steps", "noise_multiplier", "histogram_noise_ratio",
    "max_steps", "histogram_share", "calibration", "clip_norm", "release", "pate_teachers",
    "pate_aggregator", "pate_space", "synthetic_points",
    "synthetic_rows_per_point", "sinkhorn_steps", "sinkhorn_reg",
    "sinkhorn_debias", "sinkhorn_learning_rate",
)  # fmt: skip


def job_terms(cfg: TargetConfig) -> SessionTerms:
    from dpda.terms import method_terms

    j = cfg.job
    base = SessionTerms.model_validate({name: getattr(j, name) for name in _TERMS_FROM_JOB})
    if j.method == "dpda":
        return base
    return method_terms(base, j.method, j.pate_queries, j.pate_share)


def open_state(cfg: TargetConfig) -> tuple[PrivacyLedger, AuditLog]:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    conn = connect(cfg.state_dir / "state.sqlite")
    store = SqliteLedgerStore(cfg.state_dir / "state.sqlite", conn)
    ledger = PrivacyLedger(store, {cfg.job.dataset: Budget(cfg.budget_epsilon, cfg.job.delta)})
    key = signing.load_private(cfg.signing_key)
    signing.write_role_keys(cfg.state_dir, key, {"source": cfg.source_signing_public_key}, "target")
    return ledger, AuditLog(conn, "target", cfg.retain_payloads, key)


def run_job(
    cfg: TargetConfig,
    progress: Callable[[int, int], None] | None = None,
    seed: int = 0,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One job: (the results written to ``results.json``, the arrays the report plots)."""
    if cfg.job.setting == "public-source":
        return run_public_source_job(cfg, progress), {}
    ledger, audit = open_state(cfg)
    table = load_target_data(cfg)
    check_representation(table.x, cfg.job.representation, "job.representation")
    view = target_view(table.domain, cfg.job.representation, scaling_mode=cfg.job.scaling)
    terms = job_terms(cfg)
    acfg = AdaptConfig(
        reg_e=cfg.job.reg_e,
        reg_g=cfg.job.reg_g,
        classifier=cfg.job.classifier,
        seed=seed,
        select=cfg.job.select,
    )
    source = GrpcReleaseSource(cfg, ledger, audit)
    try:
        source.preflight(view.x.shape[1], terms.delta)  # clear errors before anything is asked
    except BaseException:
        source.close()
        raise
    t0 = time.perf_counter()
    try:
        res = run_dpda(source, view, terms, acfg, source.spent, progress)
        # the job ends with its results in hand and every charge checked and countersigned
        # (``spent`` settled them); tearing the channel down after it is not job time
        job_seconds = time.perf_counter() - t0
    finally:
        source.close()
    model = save_model(
        model_pipeline(cfg.job.representation, view.scaling, res.model),
        cfg.state_dir / "model.skops",
    )
    preds = write_predictions(
        cfg.job.predictions or cfg.state_dir / "predictions.csv", table.ids, res.predictions
    )
    # ε of this job alone (its session's entries composed) next to the dataset's total
    own = [e for e in ledger.store.entries(terms.dataset) if e.session == res.session_id]
    out = {
        **res.summary(terms),
        "epsilon_job": spend_of([event_from_json(e.dp_event) for e in own], terms.delta),
        "epsilon_dataset_total": res.epsilon_spent,
        "job_seconds": job_seconds,
        "method": cfg.job.method,
        "predictions": str(preds),
        "model": str(model),
        "predictions_sha256": hashlib.sha256(res.predictions.tobytes()).hexdigest(),
    }
    (cfg.state_dir / "results.json").write_text(json.dumps(out, indent=2))
    return out, figures_of(res, view, cfg.job.epsilon, res.terms.release if res.terms else None)


def run_public_source_job(
    cfg: TargetConfig, progress: Callable[[int, int], None] | None = None
) -> dict[str, Any]:
    """The reverse deployment (seed 001): this job's labeled rows are public, the serving
    daemon's rows private (``target_party.reweighting``). Writes the weights, the model on raw
    rows (class labels) and ``results.json``; its charges are in this side's ledger too."""
    from dpda.target_party.reweighting import run_reweighting_job

    ledger, audit = open_state(cfg)
    table = load_target_data(cfg)
    check_representation(table.x, cfg.job.representation, "job.representation")
    source = GrpcReleaseSource(cfg, ledger, audit)
    try:
        source.preflight(table.x.shape[1], cfg.job.delta, labeled=False)
        out, model = run_reweighting_job(cfg, source, table, progress)
        spent = source.spent()
    finally:
        source.close()
    own = [e for e in ledger.store.entries(cfg.job.dataset) if e.session == out["session_id"]]
    out["epsilon_job"] = spend_of([event_from_json(e.dp_event) for e in own], cfg.job.delta)
    out["epsilon_spent"] = spent  # the holder's dataset, every peer, as this side recomputed it
    out["protected"] = "the serving daemon's rows (this job's rows are public)"
    if model is not None:
        out["model"] = str(save_model(model, cfg.state_dir / "model.skops"))
    (cfg.state_dir / "results.json").write_text(json.dumps(out, indent=2))
    return out


def run(cfg: TargetConfig, progress: bool = True, seed: int = 0) -> dict[str, Any]:
    """``dpda target run``: one job with a progress bar on a terminal."""
    bar = Progress("releases", enabled=None if progress else False)
    return run_job(cfg, bar, seed)[0]
