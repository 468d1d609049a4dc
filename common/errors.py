"""Errors: an internal code per failure, one public catalog, one translator.

Hierarchy::

    DpdaError                 (code, public message; never carries data values)
    ├── ConfigError           bad configuration; names the field
    ├── InvalidInput          a peer or user sent something malformed
    ├── BudgetExceeded        a release would exceed a privacy cap (terminal for that cap)
    ├── LedgerCorrupt         the hash chain or a signature does not verify
    ├── PeerMisbehaved        the peer's charge, signature or payload hash is wrong
    └── SolverFailed          OT returned a non-finite or degenerate plan

Peers only ever see ``PUBLIC_CATALOG[code]``: a fixed message. The internal text (which may name
a field) stays in local logs.
"""

from __future__ import annotations


class DpdaError(Exception):
    code = "INTERNAL"


class ConfigError(DpdaError):
    code = "CONFIG_INVALID"


class InvalidInput(DpdaError):
    code = "INVALID_ARGUMENT"


class BudgetExceeded(DpdaError):
    code = "BUDGET_EXCEEDED"


class LedgerCorrupt(DpdaError):
    code = "LEDGER_CORRUPT"


class PeerMisbehaved(DpdaError):
    code = "PEER_MISBEHAVED"


class SolverFailed(DpdaError):
    code = "SOLVER_FAILED"


PUBLIC_CATALOG: dict[str, str] = {
    "INTERNAL": "internal error",
    "CONFIG_INVALID": "configuration is invalid",
    "INVALID_ARGUMENT": "the request is malformed or out of bounds",
    "BUDGET_EXCEEDED": "the privacy budget does not allow this release",
    "LEDGER_CORRUPT": "ledger verification failed",
    "PEER_MISBEHAVED": "the peer's response failed verification",
    "SOLVER_FAILED": "the transport solver failed",
}


def public_message(exc: BaseException) -> tuple[str, str]:
    """(code, fixed public message) for any exception; unknown ones map to INTERNAL."""
    code = exc.code if isinstance(exc, DpdaError) else "INTERNAL"
    return code, PUBLIC_CATALOG[code]
