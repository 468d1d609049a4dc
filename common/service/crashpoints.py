"""Named crash points: a testing hook that SIGKILLs this process at an exact protocol step.

The fault tests (``tests/integration/faults.py``) start a daemon with the environment variable
``DPDA_CRASH_AT`` set to ``name`` or ``name@N`` (the N-th time that point is reached, 1-based;
several, comma-separated). When the point is reached that time, the process writes one line
``dpda crash point NAME@N`` to stderr (so the test can observe where it died) and sends itself
SIGKILL: no cleanup, no finally blocks, no graceful shutdown — as a power cut or the OOM killer
would, except that the OS keeps what was written.

The variable is read once, at import. Without it, ``crash_point`` returns after one empty-dict
test, and nothing else changes: production code never sets it.

Points in use (each one line in the code it names):

* ``source.open_session.stored`` — a new session's row is stored, the reply not yet sent;
* ``source.release.drawn`` — a release is charged (ledger entry durable) and its noise drawn,
  the payload not stored yet;
* ``source.release.stored`` — the payload is stored, the entry not signed yet;
* ``source.release.signed`` — the entry is signed, the message not yet sent;
* ``source.pate.drawn`` / ``source.pate.stored`` — the same two steps for a PATE answer;
* ``source.countersign.stored`` — the peer's countersignature is stored, the reply not sent;
* ``target.open_session.received`` — the target has the source's OpenSession reply, not yet
  saved in ``job.json``;
* ``target.release.appended`` — the target appended a received release (or PATE answer) to its
  ledger, not yet countersigned;
* ``target.release.countersigned`` — the target's countersignature was acknowledged.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "DPDA_CRASH_AT"


def parse(spec: str) -> dict[str, int]:
    """``"a,b@3"`` → ``{"a": 1, "b": 3}``."""
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, _, nth = part.strip().partition("@")
        if name:
            out[name] = int(nth) if nth else 1
    return out


_AT = parse(os.environ.get(ENV, ""))
_SEEN: dict[str, int] = {}
_LOCK = threading.Lock()


def crash_point(name: str) -> None:
    """SIGKILL this process if ``DPDA_CRASH_AT`` names this point and this is its N-th visit."""
    if not _AT:
        return
    nth = _AT.get(name)
    if nth is None:
        return
    with _LOCK:
        seen = _SEEN[name] = _SEEN.get(name, 0) + 1
        if seen == nth:
            os.write(2, f"dpda crash point {name}@{nth}\n".encode())
            os.kill(os.getpid(), signal.SIGKILL)
