"""Composition root of the target: config → its own ledger and audit log → gRPC peer → the
DPDA job → results on disk, in a folder of the job's own (``state_dir/jobs/<job id>/``:
``results.json``, the model as one pipeline on raw rows in ``model.skops``, the predictions with
the rows' ids, the HTML report), so that no job writes over another's."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import math
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
from dp_accounting import dp_event

from dpda.data.loaders import load_domain
from dpda.data.preprocessing import Scaling, check_representation
from dpda.data.synthetic import two_domains
from dpda.data.tables import Table, read_table, write_predictions
from dpda.dp.events import event_from_json
from dpda.dp.ledger import Budget, LedgerEntry, PrivacyLedger, check_delta, spend_of
from dpda.dp.rng import secure_rng
from dpda.dp.target_disclosure import (
    NATURAL_CLIP,
    Disclosure,
    disclose,
    noisy_rows,
    plan_disclosure,
    plan_row_queries,
    query_noise_std,
)
from dpda.errors import ConfigError, LedgerCorrupt
from dpda.protocol import payload_digest
from dpda.service import settle_heap, signing
from dpda.service.audit import AuditLog
from dpda.service.config import TargetConfig
from dpda.service.ledger_store import SqliteLedgerStore, connect
from dpda.service.progress import Progress
from dpda.target_party import reruns
from dpda.target_party.client import GrpcReleaseSource
from dpda.target_party.compute import open_compute, spec_of
from dpda.target_party.pipeline import run_dpda
from dpda.target_party.report import figures_of, render
from dpda.target_party.training import model_pipeline, save_model
from dpda.target_party.view import AdaptConfig, RowQueries, resolve_scaling, target_view
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


def with_source_delta(cfg: TargetConfig) -> TargetConfig:
    """``cfg`` with ``job.delta`` set: as configured, or the δ the source publishes for the
    dataset (``DescribeDataset``), which a session's terms must use."""
    if cfg.job.delta is not None:
        return cfg
    probe = _with_delta(cfg, 0.5)  # a description reads no ledger δ
    ledger, audit = open_state(probe)
    source = GrpcReleaseSource(probe, ledger, audit)
    try:
        facts = source.describe()
    finally:
        source.close()
    return _with_delta(cfg, float(facts.delta))


def _with_delta(cfg: TargetConfig, delta: float) -> TargetConfig:
    return cfg.model_copy(update={"job": cfg.job.model_copy(update={"delta": delta})})


def job_delta(cfg: TargetConfig) -> float:
    """``job.delta`` once known (``with_source_delta``)."""
    if cfg.job.delta is None:
        raise ConfigError("job.delta: not set, and the source's published δ was not read")
    return cfg.job.delta


OWN_ROWS = "own-rows"  # the target's own ledger dataset: what it disclosed about its rows


def own_delta(cfg: TargetConfig, n_rows: int) -> float:
    """The δ of the target's own disclosures: ``[privacy] delta``, or 1/(10·nt)."""
    if cfg.privacy.delta is None:
        return 1.0 / (10.0 * n_rows)
    check_delta(cfg.privacy.delta, n_rows, "privacy.delta", "the target's table")
    return cfg.privacy.delta


def check_row_queries(cfg: TargetConfig, terms: SessionTerms) -> None:
    """PATE's queries under the target's ``[privacy] row_queries``: raw target rows leave only
    under the exact opt-in (the protected forms live in the projected space)."""
    rq = cfg.privacy.row_queries
    if terms.pate_queries > 0 and rq != "exact" and terms.pate_space != "projected":
        raise ConfigError(
            f"job.pate_space: raw sends target rows as they are; the target's [privacy] "
            f'row_queries = {rq!r} queries in the projected space only (row_queries = "exact" '
            "accepts raw rows)"
        )


def _own_release(
    cfg: TargetConfig,
    ledger: PrivacyLedger,
    rid: str,
    stored: Path,
    charge: Callable[[], LedgerEntry],
    draw: Callable[[], dict[str, np.ndarray]],
    digest_of: Callable[[dict[str, np.ndarray]], str],
) -> tuple[dict[str, np.ndarray], LedgerEntry]:
    """One release of the target's own rows (its statistics, its PATE queries): charged once
    (``charge``, before anything is drawn), drawn once, kept. The arrays are stored (fsynced)
    before the entry is signed over them, and nothing is sent before it is signed; so a stored
    copy is what was (or will be) sent, and a signed entry without one means the copy was lost
    after a send: refused, since a new draw would be a second look at the same rows for one
    charge."""
    entry = next((e for e in ledger.store.entries(OWN_ROWS) if e.request_id == rid), None)
    if entry is not None and stored.is_file():
        with np.load(stored) as z:
            arrays = {name: np.asarray(z[name]) for name in z.files}
        if entry.payload_sha256 and digest_of(arrays) != entry.payload_sha256:
            raise LedgerCorrupt(f"{stored}: differs from what the own ledger entry {rid} signed")
    elif entry is not None and entry.payload_sha256:
        raise LedgerCorrupt(
            f"{rid}: released before, and its stored copy {stored} is lost; drawing again would "
            "disclose the same rows twice for one charge (restore the file, or start a new job)"
        )
    else:
        entry = entry or charge()
        arrays = draw()  # only after the charge is durable; nothing was sent before
        with open(stored, "wb") as f:
            np.savez(f, **cast(dict[str, Any], arrays))
            f.flush()
            os.fsync(f.fileno())
    if not entry.payload_sha256:
        digest = digest_of(arrays)
        signed = LedgerEntry(**{**entry.__dict__, "payload_sha256": digest})
        key = signing.load_private(cfg.signing_key)
        ledger.store.update_signatures(
            OWN_ROWS, entry.seq, digest, "", signing.sign(key, signed.signed_message())
        )
        entry = ledger.store.entries(OWN_ROWS)[entry.seq]
    return arrays, entry


def row_queries(
    cfg: TargetConfig,
    ledger: PrivacyLedger,
    own: Disclosure | None,
    n_rows: int,
    n_queries: int = 0,
    job: str = "",
) -> RowQueries:
    """What PATE sends under ``[privacy] row_queries``. ``dp``: before the noisy rows of a
    session leave, the target charges its own ledger (``own-rows``, request id
    ``row-queries/<session>``), draws, stores and signs them (``_own_release``); a resumed
    session sends the stored rows again, uncharged (a session resumes only under the same
    policy: ``GrpcReleaseSource``). ``synthetic``: a zero-ε entry records that points drawn from
    released or public values left (post-processing). ``job`` (the job's own key, see
    ``job_key``): the queries are charged and stored per job, not per session id, so a source
    that hands a rerun a new session gets the stored queries again, never a second charge."""
    pol = cfg.privacy
    if pol.row_queries == "exact":
        return RowQueries("exact")
    delta = own_delta(cfg, n_rows)
    ledger.budgets.setdefault(OWN_ROWS, Budget(pol.epsilon_cap, delta))

    def record(sid: str, events: list, params: dict[str, Any], draw: Callable[[], np.ndarray]):
        key = job or sid
        rid = f"row-queries/{key}"
        meta = {**params, "kind": "target-row-queries", "row_queries": pol.row_queries}

        def charge() -> LedgerEntry:
            return ledger.charge(
                dataset=OWN_ROWS,
                events=events,
                session=sid,
                peer="self",
                request_id=rid,
                privacy_unit="record",
                neighbouring="replace-one",
                params={**meta, "delta": delta},
            )

        # the session id is the source's: hashed, never a path
        name = f"row-queries-{hashlib.sha256(key.encode()).hexdigest()[:32]}.npz"
        arrays, entry = _own_release(
            cfg,
            ledger,
            rid,
            cfg.state_dir / name,
            charge,
            lambda: {"queries": draw()},
            lambda a: payload_digest(np.ascontiguousarray(a["queries"], dtype="<f8").tobytes()),
        )
        if entry.params.get("row_queries") != pol.row_queries:
            raise ConfigError(
                f"privacy.row_queries: session {sid} already sent "
                f"{entry.params.get('row_queries')!r} queries; it does not resume as "
                f"{pol.row_queries!r}"
            )
        return arrays["queries"]

    if pol.row_queries == "synthetic":
        return RowQueries(
            "synthetic",
            variances=own.variances if own is not None and own.variances.size else None,
            record=lambda sid, pts: record(
                sid,
                [dp_event.NoOpDpEvent()],
                {"what": "synthetic points drawn from the released statistics (no target row)",
                 "mechanism": "post-processing", "epsilon": 0.0, "n_rows": int(pts.shape[0])},
                lambda: pts,
            ),
        )  # fmt: skip
    if own is None:  # the policy's validator makes dp need dp disclosures
        raise ConfigError("privacy.row_queries: dp needs disclosures = dp")
    plan = plan_row_queries(pol.query_epsilon, delta)
    if n_queries > 0:  # refused here, before the source has released (and charged) anything
        ledger.check(OWN_ROWS, plan.events())

    def protect(sid: str, rows: np.ndarray, clip: float) -> np.ndarray:
        try:
            query_noise_std(plan, clip)  # refused before the charge
        except ValueError as exc:
            raise ConfigError(f"privacy.row_queries: {exc}") from None
        return record(
            sid,
            plan.events(),
            {
                "what": "target rows drawn at random, projected, clipped and noised",
                "mechanism": "gaussian",
                "epsilon": spend_of(plan.events(), delta),
                "sigma": plan.noise_multiplier,
                "clip": clip,
                "n_rows": int(rows.shape[0]),
            },
            lambda: noisy_rows(rows, clip, plan, secure_rng()),
        )

    return RowQueries("dp", protect=protect)


def disclosure_digest(d: Disclosure) -> str:
    """What the target's own ledger entry binds: the released scaling and basis, as sent."""
    parts = (d.scaling.mean, d.scaling.std, d.basis)
    return payload_digest(*(np.ascontiguousarray(a, dtype="<f8").tobytes() for a in parts))


def own_disclosure(
    cfg: TargetConfig, table: Table, terms: SessionTerms, ledger: PrivacyLedger
) -> tuple[Disclosure, LedgerEntry] | None:
    """(See ``_disclose``.) First, when the job's PATE queries will be charged too (``row_queries
    = "dp"``), both charges must fit the target's cap: checked before either is made."""
    pol = cfg.privacy
    if pol.disclosures == "dp" and pol.row_queries == "dp" and terms.pate_queries > 0:
        delta = own_delta(cfg, table.x.shape[0])
        ledger.budgets[OWN_ROWS] = Budget(pol.epsilon_cap, delta)
        known = {e.request_id for e in ledger.store.entries(OWN_ROWS)}
        if _disclosure_id(cfg, table, terms) not in known:
            events = _disclosure_plan(cfg, table, terms, delta).events()
            ledger.check(OWN_ROWS, [*events, *plan_row_queries(pol.query_epsilon, delta).events()])
    return _disclose(cfg, table, terms, ledger)


def job_key(cfg: TargetConfig, table: Table, terms: SessionTerms) -> str:
    """What one job is: its terms, the target's policy and its rows (where and how many)."""
    n, k = table.x.shape
    key = json.dumps([terms.model_dump_json(), cfg.privacy.model_dump_json(), table.where, n, k])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def _disclosure_id(cfg: TargetConfig, table: Table, terms: SessionTerms) -> str:
    return "disclosure/" + job_key(cfg, table, terms)


def _disclosure_plan(cfg: TargetConfig, table: Table, terms: SessionTerms, delta: float):
    pol = cfg.privacy
    try:
        return plan_disclosure(
            pol.epsilon,
            delta,
            table.x.shape[1],
            cfg.job.representation,
            pol.row_clip,
            with_basis=terms.projection == "target-pca",
        )
    except ValueError as exc:
        if pol.row_clip is None and cfg.job.representation not in NATURAL_CLIP:
            raise ConfigError(
                f"privacy.row_clip: the {cfg.job.representation!r} representation has no "
                "natural row bound, and the target's statistics go out under its own DP with "
                'their rows clipped to one. At no privacy cost: job.representation = "l2" '
                '(or "sqrt", "rownorm": rows of norm 1, row_clip 1); or set '
                "privacy.row_clip to a bound known without reading the rows (√k × the largest "
                'value a feature can take); or privacy.disclosures = "exact" (no DP on the '
                "target's side)"
            ) from None
        raise ConfigError(f"privacy.{exc}") from None


def own_plan(cfg: TargetConfig, table: Table, terms: SessionTerms) -> dict[str, Any]:
    """What the job would charge the target's own ledger (``own-rows``: its scaling, basis and
    PATE queries under ``[privacy]``), checked as the job checks it, nothing drawn or charged:
    a ``ConfigError`` here is the one the job would raise."""
    check_row_queries(cfg, terms)
    pol = cfg.privacy
    if pol.disclosures == "exact" and pol.row_queries != "dp":
        return {"disclosures": "exact", "epsilon_charge": 0.0, "delta": None, "fits": True}
    n = table.x.shape[0]
    delta = own_delta(cfg, n)
    events: list[Any] = []
    if pol.disclosures == "dp" and not terms.source_space:  # a source-space release: nothing
        events += _disclosure_plan(cfg, table, terms, delta).events()
    if pol.row_queries == "dp" and terms.pate_queries > 0:
        events += plan_row_queries(pol.query_epsilon, delta).events()
    state = cfg.state_dir / "state.sqlite"
    prior = []
    if state.is_file():  # the own ledger as it stands (read only; a first job has none)
        conn = connect(state)
        try:
            held = SqliteLedgerStore(state, conn).entries(OWN_ROWS)
        finally:
            conn.close()
        prior = [event_from_json(e.dp_event) for e in held]
    charge = spend_of(events, delta) if events else 0.0
    after = spend_of([*prior, *events], delta) if prior or events else 0.0
    return {
        "disclosures": pol.disclosures,
        "row_queries": pol.row_queries,
        "epsilon_charge": charge,  # this job alone, on the target's own rows
        "delta": delta,
        "epsilon_total_after": after,
        "epsilon_cap": pol.epsilon_cap,
        "fits": after <= pol.epsilon_cap + 1e-12,
    }


def _disclose(
    cfg: TargetConfig, table: Table, terms: SessionTerms, ledger: PrivacyLedger
) -> tuple[Disclosure, LedgerEntry] | None:
    """Under the default ``[privacy]`` (``disclosures = "dp"``): the target's scaling, basis
    and clip norm under its own DP, charged to its own ledger (``own-rows``: every job's
    disclosures of these rows compose against ``epsilon_cap``) before anything is computed or
    sent, signed by the target. A rerun of the same job reuses the stored release, uncharged.
    None under the ``exact`` opt-in."""
    pol = cfg.privacy
    if pol.disclosures == "exact" or terms.source_space:  # a source-space release needs none
        return None
    n, k = table.x.shape
    delta = own_delta(cfg, n)
    ledger.budgets[OWN_ROWS] = Budget(pol.epsilon_cap, delta)
    plan = _disclosure_plan(cfg, table, terms, delta)
    rid = _disclosure_id(cfg, table, terms)

    def charge() -> LedgerEntry:
        events = plan.events()
        return ledger.charge(
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

    def draw() -> dict[str, np.ndarray]:
        ell = min(terms.projection_dim, n, k)  # as session_terms lowers it
        mode = resolve_scaling(cfg.job.scaling, terms)
        d = disclose(table.x, cfg.job.representation, mode, ell, plan, secure_rng())
        return {"mean": d.scaling.mean, "std": d.scaling.std, "basis": d.basis,
                "clip": np.array(d.clip_norm), "variances": d.variances}  # fmt: skip

    def of(a: dict[str, np.ndarray]) -> Disclosure:
        var = a["variances"] if "variances" in a else np.zeros(0)
        return Disclosure(Scaling(a["mean"], a["std"]), a["basis"], float(a["clip"]), plan, var)

    stored = cfg.state_dir / f"{rid.replace('/', '-')}.npz"
    arrays, entry = _own_release(
        cfg, ledger, rid, stored, charge, draw, lambda a: disclosure_digest(of(a))
    )
    return of(arrays), entry


def open_state(cfg: TargetConfig) -> tuple[PrivacyLedger, AuditLog]:
    cfg.state_dir.mkdir(parents=True, exist_ok=True)
    conn = connect(cfg.state_dir / "state.sqlite")
    store = SqliteLedgerStore(cfg.state_dir / "state.sqlite", conn)
    ledger = PrivacyLedger(store, {cfg.job.dataset: Budget(cfg.budget_epsilon, job_delta(cfg))})
    key = signing.load_private(cfg.signing_key)
    signing.write_role_keys(cfg.state_dir, key, {"source": cfg.source_signing_public_key}, "target")
    return ledger, AuditLog(conn, "target", cfg.retain_payloads, key)


JOBS_DIR = "jobs"  # under state_dir: one folder per job, named by its id


def new_job_id() -> str:
    """A job's id: random, so two jobs (the CLI's, the API's) never share a folder."""
    return uuid.uuid4().hex[:12]


def job_dir(cfg: TargetConfig, job_id: str) -> Path:
    """The folder a job writes its outputs to (created here)."""
    if not job_id or not all(c.isalnum() or c in "-_" for c in job_id):
        raise ConfigError(f"job id {job_id!r}: letters, digits, '-' and '_' only")
    out = cfg.state_dir / JOBS_DIR / job_id
    out.mkdir(parents=True, exist_ok=True)
    return out


def past_jobs(cfg: TargetConfig) -> list[tuple[str, dict[str, Any]]]:
    """(id, results) of every job with a ``results.json`` under ``state_dir/jobs``, oldest
    first."""
    root = cfg.state_dir / JOBS_DIR
    if not root.is_dir():
        return []
    found = []
    for d in root.iterdir():
        path = d / "results.json"
        if not path.is_file():
            continue
        try:
            results = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        found.append((path.stat().st_mtime_ns, d.name, results))
    return [(name, results) for _, name, results in sorted(found)]


def run_job(
    cfg: TargetConfig,
    progress: Callable[[int, int], None] | None = None,
    seed: int = 0,
    settle: bool = False,
    job_id: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One job: (the results written to ``results.json``, the arrays the report plots), its
    outputs in ``state_dir/jobs/<job_id>/`` (a new id by default).
    ``settle``: the process's entry point asks for ``settle_heap`` once the data is loaded."""
    cfg = with_source_delta(cfg)
    job_id = job_id or new_job_id()
    if cfg.job.setting == "public-source":
        return run_public_source_job(cfg, progress, job_id), {}
    ledger, audit = open_state(cfg)
    table = load_target_data(cfg)
    check_representation(table.x, cfg.job.representation, "job.representation")
    terms = job_terms(cfg)
    check_row_queries(cfg, terms)
    own = own_disclosure(cfg, table, terms, ledger)
    view = target_view(
        table.domain,
        cfg.job.representation,
        scaling_mode=resolve_scaling(cfg.job.scaling, terms),
        disclosure=own[0] if own else None,
        terms=terms,
    )
    acfg = AdaptConfig(
        reg_e=cfg.job.reg_e,
        reg_g=cfg.job.reg_g,
        classifier=cfg.job.classifier,
        seed=seed,
        select=cfg.job.select,
        transport_step=cfg.job.transport_step,
        refine=cfg.job.refine,
        keep=cfg.job.keep,
    )
    # before the source is asked anything: PATE's queries fit the target's own budget
    key = job_key(cfg, table, terms)
    rq = row_queries(
        cfg, ledger, own[0] if own else None, table.x.shape[0], terms.pate_queries, job=key
    )
    # a source that fails the job on purpose gets a bounded number of reruns
    reruns.start(cfg.state_dir, cfg.source_fingerprint, key, cfg.max_reruns)
    source = GrpcReleaseSource(cfg, ledger, audit)
    source.target_claim = own[1].to_json() if own else ""
    try:
        # clear errors before anything is asked; the source plans the terms meanwhile
        source.preflight(view.x.shape[1], terms.delta, planned=terms)
    except BaseException:
        source.close()
        raise
    try:
        # [compute]: the fits on Dask workers; releases and ledger stay in this process
        with open_compute(spec_of(cfg.compute)) as compute:
            if settle:
                settle_heap()
            t0 = time.perf_counter()
            source.compose_ahead(terms, view.scaling.std)  # while the target computes its basis
            res = run_dpda(source, view, terms, acfg, source.spent, progress, rq, compute)
            # the job ends with its results in hand and every charge checked and countersigned
            # (``spent`` settled them); tearing the channel (and cluster) down is not job time
            job_seconds = time.perf_counter() - t0
            where = compute.describe()
    finally:
        source.close()
    outdir = job_dir(cfg, job_id)
    model = save_model(
        model_pipeline(cfg.job.representation, view.scaling, res.model, view.clip_norm),
        outdir / "model.skops",
    )
    preds = write_predictions(outdir / "predictions.csv", table.ids, res.predictions)
    if cfg.job.predictions:  # the config's own path too, as asked
        write_predictions(cfg.job.predictions, table.ids, res.predictions)
    # ε of this job alone (its session's entries composed) next to the dataset's total
    mine = [e for e in ledger.store.entries(terms.dataset) if e.session == res.session_id]
    out = {
        "job_id": job_id,
        "dataset": terms.dataset,
        "source": cfg.source_address,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "output_dir": str(outdir),
        **res.summary(terms),
        "epsilon_budget": terms.epsilon,  # what this job's session may spend
        "epsilon_job": spend_of([event_from_json(e.dp_event) for e in mine], terms.delta),
        "epsilon_dataset_total": res.epsilon_spent,
        "job_seconds": job_seconds,
        "source_seconds": res.source_seconds,  # of job_seconds: calls to the source
        "compute": where,  # where the per-batch fits ran ([compute])
        "method": cfg.job.method,
        "predictions": str(preds),
        "model": str(model),
        "predictions_sha256": hashlib.sha256(res.predictions.tobytes()).hexdigest(),
        # each party's privacy side by side: the source's records, the target's own rows
        "target_disclosures": "none" if terms.source_space else cfg.privacy.disclosures,
        "target_row_queries": cfg.privacy.row_queries if res.pate_queries else None,
        # this job's disclosures of the target's rows composed: its statistics and its queries
        "target_epsilon_spent": spend_of(
            [
                event_from_json(e.dp_event)
                for e in ledger.store.entries(OWN_ROWS)
                if e.request_id in (own[1].request_id, f"row-queries/{key}")
            ],
            own[1].params["delta"],
        )
        if own
        else (0.0 if terms.source_space else None),  # 0.0: nothing of the target was sent
        "target_epsilon_total": ledger.spent(OWN_ROWS) if own else None,
        "target_delta": own[1].params["delta"] if own else None,
        "target_epsilon_cap": cfg.privacy.epsilon_cap if own else None,
    }
    (outdir / "results.json").write_text(json.dumps(out, indent=2))
    figures = figures_of(res, view, cfg.job.epsilon, res.terms.release if res.terms else None)
    figures.update(job_spend_of(mine, terms.delta))
    (outdir / "report.html").write_text(render(out, figures), encoding="utf-8")
    reruns.finish(cfg.state_dir, cfg.source_fingerprint, key)
    return out, figures


def job_spend_of(entries: list[LedgerEntry], delta: float, points: int = 24) -> dict[str, Any]:
    """This job's own ε after its releases (its session's entries composed; at most ``points``
    of them, the last always): what the report plots against the job's budget."""
    events = [event_from_json(e.dp_event) for e in entries]
    if not events:
        return {}
    at = sorted({int(round(v)) for v in np.linspace(1, len(events), min(points, len(events)))})
    return {"job_spend": [spend_of(events[:i], delta) for i in at], "job_spend_at": at}


def run_public_source_job(
    cfg: TargetConfig, progress: Callable[[int, int], None] | None = None, job_id: str = ""
) -> dict[str, Any]:
    """The reverse deployment (seed 001): this job's labeled rows are public, the serving
    daemon's rows private (``target_party.reweighting``). Writes the weights, the model on raw
    rows (class labels) and ``results.json``; its charges are in this side's ledger too."""
    from dpda.target_party.reweighting import run_reweighting_job

    cfg = with_source_delta(cfg)
    ledger, audit = open_state(cfg)
    table = load_target_data(cfg)
    check_representation(table.x, cfg.job.representation, "job.representation")
    source = GrpcReleaseSource(cfg, ledger, audit)
    try:
        source.preflight(table.x.shape[1], job_delta(cfg), labeled=False)
        out, model = run_reweighting_job(cfg, source, table, progress)
        spent = source.spent()
    finally:
        source.close()
    own = [e for e in ledger.store.entries(cfg.job.dataset) if e.session == out["session_id"]]
    out["epsilon_job"] = spend_of([event_from_json(e.dp_event) for e in own], job_delta(cfg))
    out["epsilon_spent"] = spent  # the holder's dataset, every peer, as this side recomputed it
    out["protected"] = "the serving daemon's rows (this job's rows are public)"
    outdir = job_dir(cfg, job_id or new_job_id())
    out = {"job_id": outdir.name, "output_dir": str(outdir), **out}
    if model is not None:
        out["model"] = str(save_model(model, outdir / "model.skops"))
    (outdir / "results.json").write_text(json.dumps(out, indent=2))
    return out


def run(
    cfg: TargetConfig, progress: bool = True, seed: int = 0, settle: bool = False
) -> dict[str, Any]:
    """``dpda target run``: one job with a progress bar on a terminal. ``settle``: the command's
    own process freezes its heap once the data is loaded (``settle_heap``); callers inside a
    longer-lived process (tests) leave it off."""
    bar = Progress("releases", enabled=None if progress else False)
    return run_job(cfg, bar, seed, settle)[0]
