"""The authorization table covers every RPC; the error catalog covers every code."""

from __future__ import annotations

import inspect

from dpda import errors
from dpda.pb import dpda_pb2
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.service.auth import POLICY, SERVICE, allowed
from dpda.service.status import STATUS


def test_policy_names_every_generated_method() -> None:
    methods = {m.name for m in dpda_pb2.DESCRIPTOR.services_by_name["SourceService"].methods}
    servicer = {n for n, _ in inspect.getmembers(pb_grpc.SourceServiceServicer, inspect.isfunction)}
    assert methods == servicer
    assert {f"/{SERVICE}/{m}" for m in methods} <= set(POLICY)
    for m in methods:
        assert not allowed(f"/{SERVICE}/{m}", None)  # deny by default
        assert allowed(f"/{SERVICE}/{m}", "target")
    assert not allowed("/dpda.v1.SourceService/NoSuchMethod", "target")


def test_catalog_covers_every_error_code() -> None:
    codes = {
        cls.code
        for _, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.DpdaError)
    }
    assert codes <= set(errors.PUBLIC_CATALOG)
    assert codes <= set(STATUS)
    for message in errors.PUBLIC_CATALOG.values():
        assert message and "{" not in message  # fixed text, no interpolated values
