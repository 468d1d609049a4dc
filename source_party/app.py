"""Composition root of the source daemon: config → stores, ledger, RNG → servicer → server."""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from dpda.data.loaders import Domain, load_domain
from dpda.data.preprocessing import check_representation
from dpda.data.synthetic import two_domains
from dpda.dp.ledger import Budget, PrivacyLedger, check_delta, default_delta
from dpda.dp.rng import public_rng, secure_rng, testing_streams
from dpda.errors import ConfigError
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.service import keyfiles, serde, settle_heap, signing
from dpda.service.admin import AdminApp, AdminServer, Metrics
from dpda.service.audit import RELEASE_METHODS, AuditLog, AuditRecord, ServerAuditInterceptor
from dpda.service.auth import Admission, AdmissionInterceptor, Denial, method_limits
from dpda.service.config import SourceConfig, SourceDataset
from dpda.service.ledger_store import SqliteLedgerStore, connect
from dpda.service.tls import peer_fingerprint, server_credentials
from dpda.service.tokens import daemon_token
from dpda.source_party.handlers import SourceHandlers
from dpda.source_party.releases import SourceReleaser
from dpda.source_party.servicer import SourceServicer

log = logging.getLogger("dpda.source")


def dataset_delta(ds: SourceDataset, domain: Domain) -> float:
    """The dataset's δ: configured, or 1/(10·ns) (well below 1/ns, as the policy asks)."""
    if ds.delta is None:
        return default_delta(domain.x.shape[0])
    check_delta(ds.delta, domain.x.shape[0], f"datasets.{ds.name}.delta", f"dataset {ds.name!r}")
    return ds.delta


def load_dataset(ds: SourceDataset) -> Domain:
    if ds.kind == "synthetic":
        return two_domains(*ds.synthetic_rows)[1 if ds.domain == "target" else 0]
    if ds.path is None:
        raise ConfigError(f"datasets.{ds.name}.path: required for kind {ds.kind}")
    if ds.kind == "table":
        from dpda.data.tables import check_classes, read_table

        label = ds.label_column if ds.labeled else None
        table = read_table(ds.path, label, id_column=ds.id_column)
        check_classes(table, str(ds.label_column), f"datasets.{ds.name}.label_column")
        d = table.domain
    else:
        d = load_domain(ds.path, ds.kind, ds.domain)
    check_representation(d.x, ds.representation, f"datasets.{ds.name}.representation")
    return d


@dataclass
class RunningSource:
    server: grpc.Server
    port: int
    handlers: SourceHandlers
    audit: AuditLog
    metrics: Metrics
    admin: AdminServer | None = None

    @property
    def admin_port(self) -> int:
        return self.admin.port if self.admin else 0


def _observer(metrics: Metrics, ledger: PrivacyLedger):
    """Metrics from every outgoing audit record: releases, bytes, ε per dataset and peer."""

    def observe(rec: AuditRecord) -> None:
        mech = RELEASE_METHODS.get(rec.method.rsplit("/", 1)[-1])
        if mech is None or rec.ledger_seq < 0:
            return
        metrics.releases.labels(rec.dataset, mech).inc()
        metrics.release_bytes.labels(rec.dataset, mech).inc(rec.size)
        entries = ledger.store.entries(rec.dataset)
        if rec.ledger_seq < len(entries):
            e = entries[rec.ledger_seq]
            metrics.epsilon.labels(rec.dataset, e.peer).set(e.spend_after)
            attribute_seen = any(x.privacy_unit == "attribute" for x in entries)
            metrics.epsilon_by_relation.labels(rec.dataset, "attribute").set(e.spend_after)
            record = math.inf if attribute_seen else e.spend_after
            metrics.epsilon_by_relation.labels(rec.dataset, "record").set(record)

    return observe


def _on_denied(audit: AuditLog, metrics: Metrics):
    """Every refusal at admission: a log line, ``dpda_refusals_total{code}`` and an audit record
    (direction ``refused``; for unpinned callers at most one record a second, the rest counted
    in ``dpda_refusals_unaudited_total``, so a flood cannot fill the disk with fsyncs)."""
    last = {"t": 0.0}
    lock = threading.Lock()

    def on_denied(d: Denial) -> None:
        metrics.refusals.labels(d.code).inc()
        log.warning("refused %s from %s: %s (%s)", d.method, d.caller[:20], d.code, d.reason)
        if d.role is None:
            now = time.monotonic()
            with lock:
                if now - last["t"] < 1.0:
                    metrics.refusals_unaudited.labels(d.code).inc()
                    return
                last["t"] = now
        audit.append("refused", d.method, d.caller, b"", request_id=d.code)

    return on_denied


def build(cfg: SourceConfig, handlers_cls: type[SourceHandlers] = SourceHandlers) -> RunningSource:
    """Wire the daemon; ``handlers_cls`` lets tests play a misbehaving source."""
    keyfiles.state_dir(cfg.state_dir)  # the daemon's own: no other user may swap its ledger
    keyfiles.check_private(cfg.tls.key, "tls.key")  # both keys before any state is written
    keyfiles.check_private(cfg.signing_key, "signing_key")
    conn = connect(cfg.state_dir / "state.sqlite")
    store = SqliteLedgerStore(cfg.state_dir / "state.sqlite", conn)
    domains = {d.name: load_dataset(d) for d in cfg.datasets}
    budgets = {
        d.name: Budget(
            d.epsilon,
            dataset_delta(d, domains[d.name]),
            d.accountant,
            owner=f"the source dataset {d.name!r}'s budget (its epsilon)",
        )
        for d in cfg.datasets
    }
    ledger = PrivacyLedger(store, budgets)
    if cfg.seed is not None:
        log.warning(
            "insecure_testing: noise is seeded (%d); every ledger entry records it", cfg.seed
        )
    releasers = {}
    for i, d in enumerate(cfg.datasets):
        # one noise stream per dataset, and public randomness (JL) from its own generator
        noise, public = testing_streams(cfg.seed, i) if cfg.seed is not None else (None, None)
        releasers[d.name] = SourceReleaser(
            domains[d.name],
            d.name,
            ledger,
            noise if noise is not None else secure_rng(),
            d.representation,
            d.allow_raw_queries,
            policy=d.policy,
            public=public if public is not None else public_rng(),
            insecure_seed=cfg.seed is not None,
        )
        if domains[d.name].y is not None:  # labeled: it serves release sessions
            releasers[d.name].rows()  # its per-row representation, once, before any session
    peers = {p.cert_fingerprint: p for p in cfg.peers}
    handlers = handlers_cls(
        conn,
        ledger,
        releasers,
        signing.load_private(cfg.signing_key),
        peers,
        cfg.max_batches_per_request,
        cfg.limits,
    )
    signing.write_role_keys(
        cfg.state_dir, handlers.key, {p.name: p.signing_public_key for p in cfg.peers}, "source"
    )
    audit = AuditLog(conn, "source", cfg.retain_payloads, handlers.key)
    metrics = Metrics()
    lim = cfg.limits
    max_features = max(d.x.shape[1] for d in domains.values())
    limits = method_limits(max_features, serde.MAX_REQUEST_BYTES)
    admission = Admission(
        set(peers),
        limits,
        peer_concurrency=lim.peer_concurrency,
        anonymous_concurrency=lim.anonymous_concurrency,
        peer_rate=lim.peer_rate,
        anonymous_rate=lim.anonymous_rate,
    )
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=lim.workers),
        maximum_concurrent_rpcs=lim.max_concurrent_rpcs,
        interceptors=[
            AdmissionInterceptor(admission, _on_denied(audit, metrics)),
            ServerAuditInterceptor(
                audit,
                lambda ctx: peer_fingerprint(ctx) or "anonymous",
                observe=_observer(metrics, ledger),
                timed=lambda m, sec: metrics.latency.labels(m.rsplit("/", 1)[-1]).observe(sec),
            ),
        ],
        options=[
            ("grpc.max_receive_message_length", max(limits.values())),
            ("grpc.max_send_message_length", serde.MAX_MESSAGE_BYTES),
        ],
    )
    pb_grpc.add_SourceServiceServicer_to_server(
        SourceServicer(handlers, lambda code: metrics.refusals.labels(code).inc()), server
    )
    hs = health.HealthServicer()
    hs.set("", health_pb2.HealthCheckResponse.SERVING)
    hs.set("dpda.v1.SourceService", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(hs, server)
    creds = server_credentials(cfg.tls.cert, cfg.tls.key, cfg.tls.peer_ca)
    port = server.add_secure_port(cfg.listen, creds)
    if port == 0:
        raise ConfigError(f"listen: cannot bind {cfg.listen}")
    return RunningSource(server, port, handlers, audit, metrics)


def _admin(cfg: SourceConfig, rs: RunningSource) -> AdminServer | None:
    if not cfg.admin.enabled:
        return None
    # the configured token, else one of its own in state_dir: the ledger, audit log and metrics
    # it serves name sessions, peers and spend, which no other local user may read
    token, token_path, generated = daemon_token(cfg.state_dir, cfg.admin.token_file)
    if generated:
        print(f"dpda source admin token generated in {token_path}", flush=True)
    store = rs.handlers.ledger.store

    def ready() -> bool:
        try:
            rs.handlers.conn.execute("SELECT 1").fetchone()
            return True
        except Exception:
            return False

    app = AdminApp(
        rs.metrics,
        store.entries,
        lambda: [r for r, _ in rs.audit.records()],
        ready,
        token,
        allowed_hosts=cfg.admin.allowed_hosts,
    )
    host, port = cfg.admin.listen.rsplit(":", 1)
    server = AdminServer(app, host.strip("[]"), int(port))
    server.start()
    return server


@contextmanager
def run_server(
    cfg: SourceConfig, handlers_cls: type[SourceHandlers] = SourceHandlers
) -> Iterator[RunningSource]:
    """Start the source on its (possibly 0) port; yields the running server with its port."""
    rs = build(cfg, handlers_cls)
    rs.server.start()
    try:
        rs.admin = _admin(cfg, rs)
        yield rs
    finally:
        if rs.admin is not None:
            rs.admin.stop()
        rs.server.stop(grace=2).wait()


def _write_atomic(path: Path, text: str) -> None:
    keyfiles.write_atomic(path, text.encode())


def serve(cfg: SourceConfig) -> int:
    """Run until SIGTERM/SIGINT. Writes the bound port to ``state_dir/port`` once listening."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    with run_server(cfg) as rs:
        if rs.admin is not None:
            _write_atomic(cfg.state_dir / "admin_port", str(rs.admin_port))
            admin_host = cfg.admin.listen.rsplit(":", 1)[0]
            print(f"dpda source admin API on http://{admin_host}:{rs.admin_port}", flush=True)
        settle_heap()  # started: what it keeps stays out of the collector's way
        _write_atomic(cfg.state_dir / "port", str(rs.port))
        host = cfg.listen.rsplit(":", 1)[0]
        log.info("source listening on %s:%d (mTLS, %d peers)", host, rs.port, len(cfg.peers))
        print(f"dpda source listening on {host}:{rs.port}", flush=True)
        stop.wait()
        log.info("source shutting down")
    return 0
