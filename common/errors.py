"""Errors: an internal code per failure, one public catalog, one translator.

Hierarchy::

    DpdaError                 (code, public message; never carries data values)
    ├── ConfigError           bad configuration; names the field
    ├── InvalidInput          a peer or user sent something malformed
    │   ├── TermsInvalid      session terms that do not parse or validate (public detail)
    │   └── PolicyRefused     terms outside the data holder's privacy policy (public detail)
    ├── BudgetExceeded        a release would exceed a privacy cap (terminal for that cap)
    ├── LedgerCorrupt         the hash chain or a signature does not verify
    ├── LedgerBehind          the peer's copy of the ledger lags this one: sync, then retry
    ├── PeerMisbehaved        the peer's charge, signature or payload hash is wrong
    ├── SourceDropped         a source of a several-source job failed mid-job (never sent)
    ├── SolverFailed          OT returned a non-finite or degenerate plan
    ├── NotAuthorized         the caller's certificate has no role for this method
    └── Overloaded            the caller exceeded its concurrency, rate or session limits

Peers only ever see ``PUBLIC_CATALOG[code]``: a fixed message (``dpda.service.status`` carries
it over gRPC as ``CODE: message`` and turns it back into the same class on the other side). The
internal text (which may name a field) stays in local logs. The exceptions are ``TermsInvalid``
and ``PolicyRefused``: their text is built only from the session terms and the data holder's
policy (public metadata, never a data value), so the peer is told which field was refused and
what the policy allows.
"""

from __future__ import annotations


class DpdaError(Exception):
    """``public=True``: the message concerns only public metadata (shapes, terms, policy and
    budget numbers) and is sent to the peer with the code; otherwise the peer gets the code's
    fixed text and the message stays in the local log."""

    code = "INTERNAL"

    def __init__(self, *args: object, public: bool = False) -> None:
        super().__init__(*args)
        self.public = public


class ConfigError(DpdaError):
    code = "CONFIG_INVALID"


class InvalidInput(DpdaError):
    code = "INVALID_ARGUMENT"


class TermsInvalid(InvalidInput):
    """Session terms that do not validate. The message names the field and the rule, never an
    input value (the peer sent the terms; the text still carries none of the source's data)."""

    code = "TERMS_INVALID"


class PolicyRefused(InvalidInput):
    """Terms the data holder's policy does not allow. The message is public: build it only from
    terms and policy values, never from data."""

    code = "POLICY_REFUSED"


class BudgetExceeded(DpdaError):
    code = "BUDGET_EXCEEDED"


class LedgerCorrupt(DpdaError):
    code = "LEDGER_CORRUPT"


class LedgerBehind(DpdaError):
    """The peer's copy of the ledger is behind this party's (a lagging honest peer, e.g. one
    that lost its last countersignature): it syncs (``GetLedger``) and asks again."""

    code = "LEDGER_BEHIND"


class PeerMisbehaved(DpdaError):
    code = "PEER_MISBEHAVED"


class SourceDropped(DpdaError):
    """One source of a several-source job failed while the job asked it for a release: the job
    goes on with the other sources' releases and names the one missing. Raised by the target
    only and never sent: it has no code of its own (``INTERNAL``, whose class is
    ``DpdaError``), so no peer's refusal can come back as it and make a job skip a release."""


class SolverFailed(DpdaError):
    code = "SOLVER_FAILED"


class NotAuthorized(DpdaError):
    code = "PERMISSION_DENIED"


class Overloaded(DpdaError):
    """A limit on the caller's work (concurrency, rate, sessions, planning time): retry later.
    Maps to gRPC UNAVAILABLE so an honest client backs off and retries."""

    code = "OVERLOADED"


PUBLIC_CATALOG: dict[str, str] = {
    "INTERNAL": "internal error",
    "CONFIG_INVALID": "configuration is invalid",
    "INVALID_ARGUMENT": "the request is malformed or out of bounds",
    "TERMS_INVALID": "the session terms are invalid",
    "POLICY_REFUSED": "the data holder's privacy policy does not allow these terms",
    "BUDGET_EXCEEDED": "the privacy budget does not allow this release",
    "LEDGER_CORRUPT": "ledger verification failed",
    "LEDGER_BEHIND": "the ledger copy is behind this party's: sync it and retry",
    "PEER_MISBEHAVED": "the peer's response failed verification",
    "SOLVER_FAILED": "the transport solver failed",
    "PERMISSION_DENIED": "not authorized",
    "OVERLOADED": "the caller exceeded its limits; retry later",
}


def public_message(exc: BaseException) -> tuple[str, str]:
    """(code, fixed public message) for any exception; unknown ones map to INTERNAL."""
    code = exc.code if isinstance(exc, DpdaError) else "INTERNAL"
    if isinstance(exc, PolicyRefused | TermsInvalid | BudgetExceeded) or (
        isinstance(exc, DpdaError) and exc.public
    ):
        return code, f"{PUBLIC_CATALOG[code]}: {exc}"
    return code, PUBLIC_CATALOG[code]


def error_classes() -> dict[str, type[DpdaError]]:
    """Each code's class (one class per code; the first declared wins for a shared code)."""
    out: dict[str, type[DpdaError]] = {}
    todo: list[type[DpdaError]] = [DpdaError]
    while todo:
        cls = todo.pop(0)
        out.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return out
