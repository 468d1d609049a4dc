"""The target's retrying stub: a server stream that breaks after a release arrived keeps it.

A release that reached the target left the source, signed; asking for it again would let a
source that lost its record of it (lost writes) draw it a second time (issue 12 soak)."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from dpda.target_party.transport import Retrying


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE


class _Stub:
    def __init__(self, before_break: int) -> None:
        self.calls = 0
        self.before_break = before_break

    def ReleaseBatches(self, request: object, timeout: float | None = None) -> Iterator[str]:
        self.calls += 1
        calls = self.calls

        def stream() -> Iterator[str]:
            for i in range(self.before_break):
                yield f"release {i} (call {calls})"
            raise _Unavailable()

        return stream()


def test_a_stream_broken_after_a_message_keeps_it_and_does_not_ask_again() -> None:
    stub = _Stub(before_break=1)
    got = Retrying(stub, reconnect_s=5.0).ReleaseBatches(object())  # type: ignore[arg-type]
    assert got == ["release 0 (call 1)"] and stub.calls == 1


@pytest.mark.slow
def test_a_stream_broken_before_any_message_is_retried_until_the_deadline() -> None:
    stub = _Stub(before_break=0)
    with pytest.raises(grpc.RpcError):
        Retrying(stub, reconnect_s=0.3).ReleaseBatches(object())  # type: ignore[arg-type]
    assert stub.calls >= 2
