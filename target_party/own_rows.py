"""The target's own ledger dataset, ``own-rows``: what the target discloses about its rows under
its own DP (its scaling, basis and clip norm; PATE's row queries), each charged there before
anything is drawn or sent, signed by the target, stored and reused by a rerun of the job."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np
from dp_accounting import dp_event

from dpda.data.preprocessing import Scaling
from dpda.data.tables import Table
from dpda.dp.events import event_from_json
from dpda.dp.ledger import Budget, LedgerEntry, PrivacyLedger, check_delta, default_delta, spend_of
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
from dpda.service import signing
from dpda.service.config import TargetConfig
from dpda.service.ledger_store import SqliteLedgerStore, connect
from dpda.target_party.view import RowQueries, resolve_scaling
from dpda.terms import SessionTerms

OWN_ROWS = "own-rows"  # the target's own ledger dataset: what it disclosed about its rows


OWN_BUDGET = "the target's own budget for its rows (privacy.epsilon_cap)"


def own_rng(cfg: TargetConfig, stream: int) -> np.random.Generator:
    """The noise of the target's own disclosures: a CSPRNG stream, or under an insecure testing
    ``seed`` the stream ``dpda simulate --seed`` draws the same noise from."""
    if cfg.seed is not None:
        return np.random.default_rng([cfg.seed, stream])
    return secure_rng()


def own_delta(cfg: TargetConfig, n_rows: int) -> float:
    """The δ of the target's own disclosures: ``[privacy] delta``, or 1/(10·nt)."""
    if cfg.privacy.delta is None:
        return default_delta(n_rows)
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
    ledger.budgets.setdefault(OWN_ROWS, Budget(pol.epsilon_cap, delta, owner=OWN_BUDGET))

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
            lambda: noisy_rows(rows, clip, plan, own_rng(cfg, 23)),
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
        ledger.budgets[OWN_ROWS] = Budget(pol.epsilon_cap, delta, owner=OWN_BUDGET)
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
    ledger.budgets[OWN_ROWS] = Budget(pol.epsilon_cap, delta, owner=OWN_BUDGET)
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
        d = disclose(table.x, cfg.job.representation, mode, ell, plan, own_rng(cfg, 19))
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
