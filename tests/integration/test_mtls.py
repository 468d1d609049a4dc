"""mTLS three ways (no certificate, another CA, an unlisted peer) and the listed peer."""

from __future__ import annotations

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from dpda.pb import dpda_pb2 as pb
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.service.config import load_source
from dpda.service.tls import channel_credentials, init_party
from dpda.source_party.app import run_server

from .helpers import synthetic_deployment


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("mtls")
    dep = synthetic_deployment(tmp)
    with run_server(load_source(dep.source_config)) as rs:
        yield dep, rs.port, tmp


def _ledger_call(channel: grpc.Channel) -> pb.GetLedgerResponse:
    stub = pb_grpc.SourceServiceStub(channel)
    return stub.GetLedger(pb.GetLedgerRequest(dataset="synthetic"), timeout=10)


def test_no_client_certificate_is_refused(server) -> None:
    dep, port, _ = server
    creds = grpc.ssl_channel_credentials(root_certificates=dep.target_keys.ca.read_bytes())
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch, pytest.raises(grpc.RpcError) as e:
        _ledger_call(ch)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_certificate_from_another_ca_is_refused(server) -> None:
    dep, port, tmp = server
    other = init_party(tmp / "other", "mallory")  # its own CA
    creds = channel_credentials(other.cert, other.key, dep.target_keys.ca)
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch, pytest.raises(grpc.RpcError) as e:
        _ledger_call(ch)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_valid_but_unlisted_peer_is_denied(server) -> None:
    dep, port, tmp = server
    same_ca = init_party(tmp / "unlisted", "eve", ca_dir=dep.workdir / "keys" / "ca")
    creds = channel_credentials(same_ca.cert, same_ca.key, dep.target_keys.ca)
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch:
        with pytest.raises(grpc.RpcError) as e:
            _ledger_call(ch)
        assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED
        # the unary health check is open to any authenticated TLS client
        h = health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert h.status == health_pb2.HealthCheckResponse.SERVING
        # a Watch stream would hold a server thread: pinned peers only (hardening item 2)
        with pytest.raises(grpc.RpcError) as w:
            next(health_pb2_grpc.HealthStub(ch).Watch(health_pb2.HealthCheckRequest(), timeout=10))
        assert w.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_listed_peer_is_accepted(server) -> None:
    dep, port, _ = server
    k = dep.target_keys
    creds = channel_credentials(k.cert, k.key, k.ca)
    with grpc.secure_channel(f"127.0.0.1:{port}", creds) as ch:
        assert list(_ledger_call(ch).entries_json) == []
