"""Composition root of the target: config → its own ledger and audit log → gRPC peer → the
DPDA job → results on disk, in a folder of the job's own (``state_dir/jobs/<job id>/``:
``results.json``, the model as one pipeline on raw rows in ``model.skops``, the predictions with
the rows' ids, the HTML report), so that no job writes over another's. What the target
discloses about its own rows under its own DP is charged through ``own_rows``."""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from dpda.data.loaders import load_domain
from dpda.data.preprocessing import check_representation
from dpda.data.synthetic import two_domains
from dpda.data.tables import Table, read_table, write_predictions
from dpda.dp.events import event_from_json
from dpda.dp.ledger import Budget, LedgerEntry, PrivacyLedger, spend_of
from dpda.errors import ConfigError
from dpda.service import keyfiles, settle_heap, signing
from dpda.service.audit import AuditLog
from dpda.service.config import TargetConfig
from dpda.service.ledger_store import SqliteLedgerStore, connect
from dpda.service.progress import Progress
from dpda.target_party import reruns
from dpda.target_party.client import GrpcReleaseSource
from dpda.target_party.compute import open_compute, spec_of
from dpda.target_party.own_rows import (
    OWN_ROWS,
    check_row_queries,
    job_key,
    own_disclosure,
    row_queries,
)
from dpda.target_party.pipeline import run_dpda
from dpda.target_party.report import figures_of, render
from dpda.target_party.training import model_pipeline, save_model
from dpda.target_party.view import adapt_config, resolve_scaling, target_view

log = logging.getLogger("dpda.target")


def load_target_data(cfg: TargetConfig) -> Table:
    """The target's rows (labels only if the job names a label column the table has) and the
    ids its predictions are written with."""
    job = cfg.job
    if job.data_kind == "synthetic":
        # the public-source deployment's driver holds the (public, labeled) synthetic source
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


def sizes_of(sources: list[GrpcReleaseSource]) -> tuple[int, int] | None:
    """The (rows, classes) the sources published (``preflight``), the smallest source's when
    there are several (the terms are the same at each); None when one has not published."""
    facts = [s.facts for s in sources if s.facts is not None]
    if len(facts) < len(sources) or not facts:
        return None
    least = min(facts, key=lambda f: int(f.n_rows))
    return int(least.n_rows), int(least.n_classes)


def _consortium_delta(subs: dict[str, TargetConfig]) -> TargetConfig:
    """The first source's config with ``job.delta`` set: as configured, or the δ the first
    source that answers publishes (one that is down at the start does not stop the job)."""
    from dpda.errors import DpdaError

    why: dict[str, str] = {}
    for name, sub in subs.items():
        try:
            return with_source_delta(sub)
        except DpdaError as exc:
            why[name] = f"{type(exc).__name__}: {exc}"
    raise ConfigError(
        "job.delta: not set, and no source published its δ: "
        + "; ".join(f"{n}: {w}" for n, w in why.items())
    )


def _with_delta(cfg: TargetConfig, delta: float) -> TargetConfig:
    return cfg.model_copy(update={"job": cfg.job.with_changes(delta=delta)})


def job_delta(cfg: TargetConfig) -> float:
    """``job.delta`` once known (``with_source_delta``)."""
    if cfg.job.delta is None:
        raise ConfigError("job.delta: not set, and the source's published δ was not read")
    return cfg.job.delta


def own_budget(cfg: TargetConfig) -> str:
    """Whose budget ``budget_epsilon`` is, for a refusal."""
    return f"the target's own budget for the source's dataset {cfg.job.dataset!r} (budget_epsilon)"


def open_state(cfg: TargetConfig) -> tuple[PrivacyLedger, AuditLog]:
    keyfiles.state_dir(cfg.state_dir)  # the daemon's own: no other user may swap its ledger
    keyfiles.check_private(cfg.tls.key, "tls.key")  # before any state is written, as the source
    conn = connect(cfg.state_dir / "state.sqlite")
    store = SqliteLedgerStore(cfg.state_dir / "state.sqlite", conn)
    # the job's dataset once its δ is known (``with_source_delta``); the daemon's own reads
    # (``target serve``) need none
    budgets = (
        {cfg.job.dataset: Budget(cfg.budget_epsilon, cfg.job.delta, owner=own_budget(cfg))}
        if cfg.job.delta is not None
        else {}
    )
    ledger = PrivacyLedger(store, budgets)
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
    if cfg.sources:  # a job over several sources
        return run_consortium_job(cfg, progress, seed, job_id)
    cfg = with_source_delta(cfg)
    seed = cfg.seed if cfg.seed is not None else seed
    job_id = job_id or new_job_id()
    if cfg.job.setting == "public-source":
        return run_public_source_job(cfg, progress, job_id), {}
    ledger, audit = open_state(cfg)
    table = load_target_data(cfg)
    check_representation(table.x, cfg.job.representation, "job.representation")
    terms = cfg.job.terms()
    check_row_queries(cfg, terms)
    key = job_key(cfg, table, terms)
    # a source that fails the job on purpose gets a bounded number of reruns: refused before
    # the source is asked anything
    reruns.start(cfg.state_dir, cfg.source_fingerprint, key, cfg.max_reruns)
    source = GrpcReleaseSource(cfg, ledger, audit)
    try:
        # the source's published facts (δ, features, labels) against the job before anything
        # of the target's rows is charged or sent; the source plans the terms meanwhile
        source.preflight(table.x.shape[1], terms.delta, planned=terms)
        own = own_disclosure(cfg, table, terms, ledger)
        # the view in a list the job takes it from: once the job moves the rows into the
        # source's DP standardization, the first view is freed (no name here holds it)
        views = [
            target_view(
                table.domain,
                cfg.job.representation,
                scaling_mode=resolve_scaling(cfg.job.scaling, terms),
                disclosure=own[0] if own else None,
                terms=terms,
            )
        ]
        acfg = adapt_config(cfg.job, seed)
        # before the source is asked for a release: PATE's queries fit the target's budget
        rq = row_queries(
            cfg, ledger, own[0] if own else None, table.x.shape[0], terms.pate_queries, job=key
        )
        source.target_claim = own[1].to_json() if own else ""
    except BaseException:
        source.close()
        raise
    try:
        # [compute]: the fits on Dask workers; releases and ledger stay in this process
        with open_compute(spec_of(cfg.compute)) as compute:
            if settle:
                settle_heap()
            t0 = time.perf_counter()
            source.compose_ahead(terms, views[0].scaling.std)  # while the target computes its basis
            res = run_dpda(
                source, views.pop(), terms, acfg, source.spent, progress, rq, compute,
                sizes_of([source]),
            )  # fmt: skip
            # the job ends with its results in hand and every charge checked and countersigned
            # (``spent`` settled them); tearing the channel (and cluster) down is not job time
            job_seconds = time.perf_counter() - t0
            where = compute.describe()
    finally:
        source.close()
    view = res.view  # the view the model was fitted in, and the mapped points lie in
    assert view is not None  # a finished job's result carries it
    outdir, written = write_model_and_predictions(cfg, job_id, table, res)
    # ε of this job alone (its session's entries composed) next to the dataset's total
    mine = [e for e in ledger.store.entries(terms.dataset) if e.session == res.session_id]
    out = {
        **written,
        "dataset": terms.dataset,
        "source": cfg.source_address,
        **res.summary(terms),
        "epsilon_budget": terms.epsilon,  # what this job's session may spend
        # the source's cap on its dataset over every job and peer, as it published it
        "epsilon_dataset_cap": float(source.facts.dataset_epsilon_cap) if source.facts else None,
        "epsilon_job": spend_of([event_from_json(e.dp_event) for e in mine], terms.delta),
        "epsilon_dataset_total": res.epsilon_spent,
        "job_seconds": job_seconds,
        "source_seconds": res.source_seconds,  # of job_seconds: calls to the source
        "compute": where,  # where the per-batch fits ran ([compute])
        "method": cfg.job.method,
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
        "preprocessing": preprocessing_report(mine, view.standardization),
    }
    figures = write_results(outdir, out, res, cfg.job.epsilon, job_spend_of(mine, terms.delta))
    reruns.finish(cfg.state_dir, cfg.source_fingerprint, key)
    return out, figures


def run_consortium_job(
    cfg: TargetConfig,
    progress: Callable[[int, int], None] | None = None,
    seed: int = 0,
    job_id: str | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """One job over several sources (``[[sources]]``, ``dpda.target_party.consortium``): a
    session at each source under the same terms, each source checked, pinned and charged on
    its own, the target's copy of each source's ledger in its own folder
    (``TargetConfig.each_source``). A source that refuses or fails is left out and named
    (``consortium.missing``); the job needs two. Outputs as ``run_job``'s, plus each source's ε
    (``epsilon_spent_by_source``, and this job's alone, ``epsilon_job_by_source``)."""
    from dpda.errors import DpdaError
    from dpda.target_party.consortium import Consortium, check_consortium_terms

    subs = cfg.each_source()
    first = _consortium_delta(subs)  # δ as set, or the first answering source's
    terms = first.job.terms()
    check_consortium_terms(terms)
    seed = cfg.seed if cfg.seed is not None else seed
    job_id = job_id or new_job_id()
    table = load_target_data(cfg)
    check_representation(table.x, cfg.job.representation, "job.representation")
    sources: dict[str, GrpcReleaseSource] = {}
    left_out: dict[str, str] = {}
    try:
        for name, sub_cfg in subs.items():
            sub_cfg = sub_cfg.model_copy(update={"job": first.job})
            try:
                ledger, audit = open_state(sub_cfg)
                src = GrpcReleaseSource(sub_cfg, ledger, audit)
            except DpdaError as exc:
                left_out[name] = f"{type(exc).__name__}: {exc}"
                continue
            try:
                src.preflight(table.x.shape[1], terms.delta, planned=terms)
            except DpdaError as exc:  # refused or unreachable: the job goes on without it
                src.close()
                left_out[name] = f"{type(exc).__name__}: {exc}"
                continue
            sources[name] = src
        if len(sources) < 2:
            raise ConfigError(
                f"several sources: {len(sources)} of {len(subs)} answered; a job over several "
                "sources needs two: " + "; ".join(f"{n}: {why}" for n, why in left_out.items())
            )
        con = Consortium(sources, {n: s.spent for n, s in sources.items()})
        views = [
            target_view(
                table.domain,
                cfg.job.representation,
                scaling_mode=resolve_scaling(cfg.job.scaling, terms),
                terms=terms,
            )
        ]
        acfg = adapt_config(cfg.job, seed)
        with open_compute(spec_of(cfg.compute)) as compute:
            t0 = time.perf_counter()
            res = run_dpda(
                con, views.pop(), terms, acfg, con.spent, progress, None, compute,
                sizes_of(list(sources.values())),
            )  # fmt: skip
            job_seconds = time.perf_counter() - t0
            where = compute.describe()
        mine = {
            name: [
                event_from_json(e.dp_event)
                for e in src.ledger.store.entries(terms.dataset)
                if e.session == con.sessions[name].session_id
            ]
            for name, src in sources.items()
        }
        spent = con.spent_by_source()
    finally:
        for src in sources.values():
            src.close()
    outdir, written = write_model_and_predictions(cfg, job_id, table, res)
    report = con.report()
    report["missing"] = {**left_out, **report["missing"]}
    report["sources"] = list(subs)
    out = {
        **written,
        "dataset": terms.dataset,
        "sources": {name: c.source_address for name, c in subs.items()},
        **res.summary(terms),
        "epsilon_budget": terms.epsilon,  # what each source's session may spend
        # a source that left the job may have charged a release the target never received:
        # what it spent is on its own ledger, not known here (None)
        "epsilon_spent_by_source": {
            n: None if n in report["missing"] else v for n, v in spent.items()
        },
        "epsilon_job_by_source": {
            n: None if n in report["missing"] else spend_of(ev, terms.delta)
            for n, ev in mine.items()
        },
        # a record belongs to one source: the most any one source's records spent
        "epsilon_dataset_total": max(v for n, v in spent.items() if n not in report["missing"]),
        "consortium": report,
        "job_seconds": job_seconds,
        "source_seconds": res.source_seconds,
        "compute": where,
        "method": cfg.job.method,
        "target_disclosures": "none",  # source-space releases: nothing of the rows is sent
        "target_epsilon_spent": 0.0,
        "preprocessing": {"mode": "none"},
    }
    return out, write_results(outdir, out, res, cfg.job.epsilon, {})


def write_model_and_predictions(
    cfg: TargetConfig, job_id: str, table: Table, res: Any
) -> tuple[Path, dict[str, Any]]:
    """A finished job's model (the pipeline that reads raw rows) and predictions in its folder
    (and at the config's own ``predictions`` path, as asked); returns the folder and the
    fields every job's results.json opens with."""
    outdir = job_dir(cfg, job_id)
    view = res.view  # the view the model was fitted in
    assert view is not None  # a finished job's result carries it
    model = save_model(
        model_pipeline(
            cfg.job.representation, view.scaling, res.model, view.clip_norm, view.standardization
        ),
        outdir / "model.skops",
    )
    preds = write_predictions(outdir / "predictions.csv", table.ids, res.predictions)
    if cfg.job.predictions:
        write_predictions(cfg.job.predictions, table.ids, res.predictions)
    return outdir, {
        "job_id": job_id,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "output_dir": str(outdir),
        "predictions": str(preds),
        "model": str(model),
        "predictions_sha256": hashlib.sha256(res.predictions.tobytes()).hexdigest(),
    }


def write_results(
    outdir: Path, out: dict[str, Any], res: Any, epsilon: float, spend: dict[str, Any]
) -> dict[str, Any]:
    """results.json and report.html of a finished job; returns the report's figures (``spend``:
    the job's own ε after each release, when known)."""
    (outdir / "results.json").write_text(json.dumps(out, indent=2))
    figures = figures_of(res, res.view, epsilon, res.terms.release if res.terms else None)
    figures.update(spend)
    (outdir / "report.html").write_text(render(out, figures), encoding="utf-8")
    return figures


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
    """The public-source deployment: this job's labeled rows are public, the serving
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


def preprocessing_report(entries: list[Any], st: Any) -> dict[str, Any]:
    """What the source's DP standardization of the job estimated, as ``dpda simulate --json``
    reports it: its spec as the signed entry charged it (share, noise) and the statistics the
    first release carried (C, the scales); the row counts it estimated stay with the source."""
    spec = next((e.params["preprocessing"] for e in entries if "preprocessing" in e.params), None)
    if spec is None or st is None:
        return {"mode": "none"}
    summary = {k: v for k, v in st.summary().items() if not k.startswith("rows_")}
    return {"mode": "standardize", "share": spec.get("share"), "spec": spec, **summary}
