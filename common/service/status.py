"""The one translation between the package's errors and gRPC, both ways.

Out (a daemon refusing a call): ``abort_with`` sends ``STATUS[code]`` with the details
``"CODE: public message"`` (``dpda.errors.public_message``: the catalog's fixed text, plus the
detail only for errors that are public by construction). In (a client reading a refusal):
``from_rpc_error`` reads the code back from the details and raises the same class, so a peer
whose ledger lags is told ``LedgerBehind`` (sync and retry), not that a ledger is corrupt;
details without a known code fall back to the status code's broadest class.
"""

from __future__ import annotations

from typing import Any

import grpc

from dpda.errors import (
    PUBLIC_CATALOG,
    BudgetExceeded,
    DpdaError,
    InvalidInput,
    Overloaded,
    PeerMisbehaved,
    error_classes,
    public_message,
)

# each catalog code's gRPC status
STATUS: dict[str, grpc.StatusCode] = {
    "INTERNAL": grpc.StatusCode.INTERNAL,
    "CONFIG_INVALID": grpc.StatusCode.FAILED_PRECONDITION,
    "INVALID_ARGUMENT": grpc.StatusCode.INVALID_ARGUMENT,
    "TERMS_INVALID": grpc.StatusCode.INVALID_ARGUMENT,
    "POLICY_REFUSED": grpc.StatusCode.INVALID_ARGUMENT,
    "BUDGET_EXCEEDED": grpc.StatusCode.RESOURCE_EXHAUSTED,
    "LEDGER_CORRUPT": grpc.StatusCode.FAILED_PRECONDITION,
    "LEDGER_BEHIND": grpc.StatusCode.FAILED_PRECONDITION,
    "PEER_MISBEHAVED": grpc.StatusCode.PERMISSION_DENIED,
    "SOLVER_FAILED": grpc.StatusCode.INTERNAL,
    "PERMISSION_DENIED": grpc.StatusCode.PERMISSION_DENIED,
    "OVERLOADED": grpc.StatusCode.UNAVAILABLE,
}

# a status without a code in its details (another server, a proxy): the broadest class
_BY_STATUS: dict[grpc.StatusCode, type[DpdaError]] = {
    grpc.StatusCode.RESOURCE_EXHAUSTED: BudgetExceeded,
    grpc.StatusCode.INVALID_ARGUMENT: InvalidInput,
    grpc.StatusCode.PERMISSION_DENIED: PeerMisbehaved,
    grpc.StatusCode.UNAVAILABLE: Overloaded,
}


def details_of(code: str, message: str | None = None) -> str:
    """The details string a refusal carries: ``CODE: message`` (the catalog's by default)."""
    return f"{code}: {PUBLIC_CATALOG[code] if message is None else message}"


def abort_with(context: grpc.ServicerContext, exc: BaseException) -> None:
    """Abort the call with ``exc``'s status and public details (raises, as ``abort`` does)."""
    code, message = public_message(exc)
    context.abort(STATUS[code], details_of(code, message))


def from_rpc_error(exc: Any, who: str = "peer") -> DpdaError:
    """The package's error for a refusal by ``who``, the same class it raised."""
    status = exc.code() if hasattr(exc, "code") else None
    detail = exc.details() if hasattr(exc, "details") else ""
    code = (detail or "").split(":", 1)[0].strip()
    cls = error_classes().get(code) if code in PUBLIC_CATALOG else None
    if cls is None:
        fallback = _BY_STATUS.get(status) if status is not None else None
        if fallback is None:
            return DpdaError(f"{who} error: {status}")
        cls = fallback
        if status == grpc.StatusCode.UNAVAILABLE:  # no answer at all: nothing was refused
            return cls(f"{who} unreachable: {detail}", public=True)
    return cls(f"{who} refused: {detail}", public=True)
