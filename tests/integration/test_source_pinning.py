"""The target pins the source's certificate before it sends anything.

9ac3bc1: the target checked only that the server's certificate chained to the peer CA, so an
impostor holding any certificate from that CA (here: a real source daemon serving the same
datasets with another certificate, as a compromised or careless CA would allow) received the
target's session terms, its projection basis and its column means in ``OpenSession``. Now the
target compares the server certificate's fingerprint with ``source_fingerprint`` in a TLS
handshake that sends no application byte, and refuses.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from dpda.errors import DpdaError, PeerMisbehaved
from dpda.service.config import TlsConfig, load_source, load_target
from dpda.service.tls import check_server_fingerprint, grpc_host_port, init_party
from dpda.source_party.app import run_server
from dpda.target_party.app import open_state, run_job

from .helpers import synthetic_deployment


def _impostor_source(tmp: Path, dep) -> object:
    """The honest source's config with another certificate from the same CA, and its own state."""
    imp = init_party(tmp / "impostor-keys", "source-org", ca_dir=dep.workdir / "keys" / "ca")
    assert imp.fingerprint != dep.source_keys.fingerprint
    cfg = load_source(dep.source_config)
    return cfg.model_copy(
        update={
            "state_dir": tmp / "impostor-state",
            "tls": TlsConfig(cert=imp.cert, key=imp.key, peer_ca=cfg.tls.peer_ca),
        }
    )


def test_an_impostor_source_gets_nothing(tmp_path: Path) -> None:
    dep = synthetic_deployment(tmp_path)
    with run_server(_impostor_source(tmp_path, dep)) as rs:
        tcfg = load_target(dep.target_config).model_copy(
            update={"source_address": f"127.0.0.1:{rs.port}", "reconnect_s": 0.0}
        )
        with pytest.raises(PeerMisbehaved, match="not the pinned source_fingerprint"):
            run_job(tcfg)
        methods = [r.method for r, _ in rs.audit.records()]
        # the old target had opened a session: the impostor's audit log held OpenSession, and
        # its handler had the target's disclosure (basis, column means)
        assert not any("OpenSession" in m for m in methods), methods
        assert methods == [], methods  # not even a ledger sync: no gRPC request at all
        assert rs.handlers.ledger.store.entries("synthetic") == []
    # and the target's own audit log shows nothing sent either
    _, audit = open_state(tcfg)
    assert [r for r, _ in audit.records() if r.direction == "out"] == []


def test_the_pinned_source_is_accepted(tmp_path: Path) -> None:
    dep = synthetic_deployment(tmp_path)
    with run_server(load_source(dep.source_config)) as rs:
        tcfg = load_target(dep.target_config).model_copy(
            update={"source_address": f"127.0.0.1:{rs.port}"}
        )
        k = dep.target_keys
        for address in (
            f"127.0.0.1:{rs.port}",
            f"localhost:{rs.port}",
            f"dns:///127.0.0.1:{rs.port}",
        ):
            got = check_server_fingerprint(
                address, k.cert, k.key, k.ca, dep.source_keys.fingerprint, timeout=10
            )
            assert got == dep.source_keys.fingerprint
        results, _ = run_job(tcfg)
        assert 0 < results["epsilon_spent"] <= 4.0
        methods = [r.method for r, _ in rs.audit.records()]
        assert any("OpenSession" in m for m in methods), methods


def test_unreachable_source_and_address_forms(tmp_path: Path) -> None:
    assert grpc_host_port("127.0.0.1:5000") == ("127.0.0.1", 5000)
    assert grpc_host_port("[::1]:5000") == ("::1", 5000)
    assert grpc_host_port("dns:///localhost:5000") == ("localhost", 5000)
    assert grpc_host_port("dns://8.8.8.8/example.org:5000") == ("example.org", 5000)
    assert grpc_host_port("ipv4:10.0.0.1:5000") == ("10.0.0.1", 5000)
    assert grpc_host_port("example.org") == ("example.org", 443)
    dep = synthetic_deployment(tmp_path)
    k = dep.target_keys
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(DpdaError, match="unavailable") as e:
        check_server_fingerprint(
            f"127.0.0.1:{port}", k.cert, k.key, k.ca, dep.source_keys.fingerprint, timeout=2
        )
    assert not isinstance(e.value, PeerMisbehaved)


def test_an_impostor_taking_over_the_address_mid_job_gets_nothing(tmp_path: Path) -> None:
    """The pin is checked again before every retry: when the source goes away and another
    certificate from the same CA answers on its address, the target stops with PeerMisbehaved
    instead of sending its next request there."""
    from dpda.protocol import TargetDisclosure
    from dpda.target_party.client import GrpcReleaseSource
    from dpda.terms import SessionTerms

    from .helpers import DELTA

    dep = synthetic_deployment(tmp_path)
    honest = load_source(dep.source_config)
    with run_server(honest) as rs:
        port = rs.port
        tcfg = load_target(dep.target_config).model_copy(
            update={"source_address": f"127.0.0.1:{port}", "reconnect_s": 20.0}
        )
        ledger, audit = open_state(tcfg)
        client = GrpcReleaseSource(tcfg, ledger, audit)
        terms = SessionTerms(
            dataset="synthetic", epsilon=1.0, delta=DELTA, projection_dim=5, projection="jl"
        )
        info = client.open_session(terms, TargetDisclosure())
    impostor = _impostor_source(tmp_path, dep).model_copy(update={"listen": f"127.0.0.1:{port}"})
    with run_server(impostor) as imp:
        with pytest.raises(PeerMisbehaved, match="not the pinned source_fingerprint"):
            client.release(info.session_id, 0)
        requests = [r.method for r, _ in imp.audit.records()]
        assert requests == [], requests
    client.channel.close()
