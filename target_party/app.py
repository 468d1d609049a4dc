"""Composition root of the target: config → its own ledger and audit log → gRPC peer → the
DPDA job → results on disk (``state_dir/results.json``, the model as one pipeline on raw rows in
``state_dir/model.skops``, the predictions with the rows' ids)."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from dpda.data.loaders import load_domain
from dpda.data.preprocessing import Scaling, check_representation
from dpda.data.synthetic import two_domains
from dpda.data.tables import Table, read_table, write_predictions
from dpda.dp.events import event_from_json
from dpda.dp.ledger import Budget, LedgerEntry, PrivacyLedger, spend_of
from dpda.dp.rng import secure_rng
from dpda.dp.target_disclosure import Disclosure, disclose, plan_disclosure
from dpda.errors import ConfigError
from dpda.protocol import payload_digest
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
    "sinkhorn_debias", "sinkhorn_learning_rate", "cost", "metric_share", "metric_dim",
    "metric_pairs", "metric_margin", "metric_clip", "metric_steps", "metric_learning_rate",
)  # fmt: skip


def job_terms(cfg: TargetConfig) -> SessionTerms:
    from dpda.terms import method_terms

    j = cfg.job
    base = SessionTerms.model_validate({name: getattr(j, name) for name in _TERMS_FROM_JOB})
    if j.method == "dpda":
        return base
    return method_terms(base, j.method, j.pate_queries, j.pate_share)


OWN_ROWS = "own-rows"  # the target's own ledger dataset: what it disclosed about its rows


def own_delta(cfg: TargetConfig, n_rows: int) -> float:
    return cfg.privacy.delta if cfg.privacy.delta is not None else 1.0 / (10.0 * n_rows)


def check_row_queries(cfg: TargetConfig, terms: SessionTerms) -> None:
    """PATE sends each queried target row (projected) exactly: only under the opt-in."""
    if terms.pate_queries > 0 and not cfg.privacy.allow_exact_row_queries:
        raise ConfigError(
            f"job.method: {cfg.job.method} sends each queried target row to the source exactly; "
            "the target's [privacy] policy does not allow that (allow_exact_row_queries = true "
            "accepts it)"
        )


def disclosure_digest(d: Disclosure) -> str:
    """What the target's own ledger entry binds: the released scaling and basis, as sent."""
    parts = (d.scaling.mean, d.scaling.std, d.basis)
    return payload_digest(*(np.ascontiguousarray(a, dtype="<f8").tobytes() for a in parts))


def own_disclosure(
    cfg: TargetConfig, table: Table, terms: SessionTerms, ledger: PrivacyLedger
) -> tuple[Disclosure, LedgerEntry] | None:
    """Under the default ``[privacy]`` (``disclosures = "dp"``): the target's scaling, basis
    and clip norm under its own DP, charged to its own ledger (``own-rows``: every job's
    disclosures of these rows compose against ``epsilon_cap``) before anything is computed or
    sent, signed by the target. A rerun of the same job reuses the stored release, uncharged.
    None under the ``exact`` opt-in."""
    pol = cfg.privacy
    if pol.disclosures == "exact":
        return None
    n, k = table.x.shape
    delta = own_delta(cfg, n)
    ledger.budgets[OWN_ROWS] = Budget(pol.epsilon_cap, delta)
    try:
        plan = plan_disclosure(
            pol.epsilon,
            delta,
            k,
            cfg.job.representation,
            pol.row_clip,
            with_basis=terms.projection == "target-pca",
        )
    except ValueError as exc:
        raise ConfigError(f"privacy.{exc}") from None
    key = json.dumps([terms.model_dump_json(), pol.model_dump_json(), table.where, n, k])
    rid = "disclosure/" + hashlib.sha256(key.encode()).hexdigest()[:32]
    stored = cfg.state_dir / f"{rid.replace('/', '-')}.npz"
    entry = next((e for e in ledger.store.entries(OWN_ROWS) if e.request_id == rid), None)
    if entry is not None and stored.is_file():
        with np.load(stored) as z:
            d = Disclosure(Scaling(z["mean"], z["std"]), z["basis"], float(z["clip"]), plan)
        return d, entry
    if entry is None:
        events = plan.events()
        entry = ledger.charge(
            dataset=OWN_ROWS,
            events=events,
            session="",
            peer="self",
            request_id=rid,
            privacy_unit="record",
            neighbouring="replace-one",
            params={
                "kind": "target-disclosure",
                "mechanism": "gaussian column sums and squares"
                + (" + analyze-gauss covariance" if plan.with_basis else ""),
                "epsilon": spend_of(events, delta),
                "delta": delta,
                "sigmas": [s for s in plan.sigmas if math.isfinite(s)],
                "row_clip": plan.row_clip,
                "z_clip": plan.z_clip,
                "n_rows": n,
            },
        )
    # drawn only after the charge is durable; nothing was sent before (a crash here redraws)
    ell = min(terms.projection_dim, n, k)  # as session_terms lowers it
    d = disclose(table.x, cfg.job.representation, cfg.job.scaling, ell, plan, secure_rng())
    np.savez(stored, mean=d.scaling.mean, std=d.scaling.std, basis=d.basis, clip=d.clip_norm)
    key_ = signing.load_private(cfg.signing_key)
    digest = disclosure_digest(d)
    signed = LedgerEntry(**{**entry.__dict__, "payload_sha256": digest})
    ledger.store.update_signatures(
        OWN_ROWS, entry.seq, digest, "", signing.sign(key_, signed.signed_message())
    )
    return d, ledger.store.entries(OWN_ROWS)[entry.seq]


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
    terms = job_terms(cfg)
    check_row_queries(cfg, terms)
    own = own_disclosure(cfg, table, terms, ledger)
    view = target_view(
        table.domain,
        cfg.job.representation,
        scaling_mode=cfg.job.scaling,
        disclosure=own[0] if own else None,
    )
    acfg = AdaptConfig(
        reg_e=cfg.job.reg_e,
        reg_g=cfg.job.reg_g,
        classifier=cfg.job.classifier,
        seed=seed,
        select=cfg.job.select,
    )
    source = GrpcReleaseSource(cfg, ledger, audit)
    source.target_claim = own[1].to_json() if own else ""
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
    mine = [e for e in ledger.store.entries(terms.dataset) if e.session == res.session_id]
    out = {
        **res.summary(terms),
        "epsilon_job": spend_of([event_from_json(e.dp_event) for e in mine], terms.delta),
        "epsilon_dataset_total": res.epsilon_spent,
        "job_seconds": job_seconds,
        "method": cfg.job.method,
        "predictions": str(preds),
        "model": str(model),
        "predictions_sha256": hashlib.sha256(res.predictions.tobytes()).hexdigest(),
        # each party's privacy side by side: the source's records, the target's own rows
        "target_disclosures": cfg.privacy.disclosures,
        "target_epsilon_spent": own[1].params["epsilon"] if own else None,
        "target_epsilon_total": ledger.spent(OWN_ROWS) if own else None,
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
