"""The error catalog and its gRPC translation: every code has a class, a public text and a
status, and a refusal read back on the other side is the class that was raised."""

from __future__ import annotations

import grpc
import pytest

from dpda import errors
from dpda.service.status import STATUS, abort_with, from_rpc_error


class _Refusal(grpc.RpcError):
    """A refusal as a gRPC client sees it (the edge: no server needed to carry two strings)."""

    def __init__(self, status: grpc.StatusCode, details: str) -> None:
        self._status, self._details = status, details

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return self._details


class _Context:
    """What ``abort_with`` asks of a servicer context: ``abort`` records and raises."""

    def abort(self, status: grpc.StatusCode, details: str) -> None:
        self.status, self.details = status, details
        raise grpc.RpcError(details)


def test_every_code_has_one_class_one_public_text_and_one_status() -> None:
    classes = errors.error_classes()
    assert set(classes) == set(errors.PUBLIC_CATALOG) == set(STATUS)
    for code, cls in classes.items():
        assert cls.code == code and issubclass(cls, errors.DpdaError)


@pytest.mark.parametrize("code", sorted(errors.PUBLIC_CATALOG))
def test_a_refusal_comes_back_as_the_class_that_was_raised(code: str) -> None:
    cls = errors.error_classes()[code]
    ctx = _Context()
    with pytest.raises(grpc.RpcError):
        abort_with(ctx, cls("a private detail: row 17 = 0.25"))
    assert ctx.status == STATUS[code]
    # only the errors whose text is public by construction (terms, policy, budget numbers)
    # carry it; the others send the catalog's fixed text
    public = ("POLICY_REFUSED", "TERMS_INVALID", "BUDGET_EXCEEDED")
    assert ("row 17" in ctx.details) == (code in public)
    back = from_rpc_error(_Refusal(ctx.status, ctx.details))
    assert type(back) is cls


def test_a_lagging_peer_is_told_to_sync_not_that_the_ledger_is_corrupt() -> None:
    ctx = _Context()
    with pytest.raises(grpc.RpcError):
        abort_with(ctx, errors.LedgerBehind("heads differ"))
    back = from_rpc_error(_Refusal(ctx.status, ctx.details))
    assert isinstance(back, errors.LedgerBehind) and not isinstance(back, errors.LedgerCorrupt)
    assert "sync" in str(back) and "verification failed" not in str(back)
    assert str(from_rpc_error(_Refusal(ctx.status, ctx.details), "source")).startswith(
        "source refused: LEDGER_BEHIND"
    )


def test_a_status_without_a_code_falls_back_to_its_broadest_class() -> None:
    assert type(from_rpc_error(_Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota"))) is (
        errors.BudgetExceeded
    )
    assert type(from_rpc_error(_Refusal(grpc.StatusCode.DATA_LOSS, "?"))) is errors.DpdaError


def test_a_peer_that_cannot_be_reached_is_said_unreachable_not_refused() -> None:
    """gRPC's own UNAVAILABLE (no server answered) is not a refusal; an OVERLOADED answer is."""
    gone = from_rpc_error(
        _Refusal(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses"), "source"
    )
    assert str(gone).startswith("source unreachable: failed to connect")
    ctx = _Context()
    with pytest.raises(grpc.RpcError):
        abort_with(ctx, errors.Overloaded("busy"))
    busy = from_rpc_error(_Refusal(ctx.status, ctx.details), "source")
    assert str(busy).startswith("source refused: OVERLOADED")


@pytest.mark.parametrize(
    ("status", "detail"),
    [
        (grpc.StatusCode.INTERNAL, "INTERNAL: internal error"),
        (grpc.StatusCode.UNAVAILABLE, "SOURCE_DROPPED: a source of the job failed"),
        (grpc.StatusCode.UNAVAILABLE, "SourceDropped"),
    ],
)
def test_no_peer_refusal_comes_back_as_a_dropped_source(status, detail) -> None:
    """A several-source job skips a release only on the target's own ``SourceDropped``: a
    peer that names it, or anything like it, is read as another error."""
    back = from_rpc_error(_Refusal(status, detail), "source")
    assert not isinstance(back, errors.SourceDropped)
