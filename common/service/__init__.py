"""Infrastructure both daemons share: wire (de)serialization, TLS and pinning, admission,
signatures, the audit log, the admin API, configuration, key files, crash points, progress."""

import gc
import sys

SWITCH_INTERVAL_S = 0.0005  # CPython's default is 0.005


def responsive_io_threads() -> None:
    """A party's I/O threads (gRPC handlers, fsyncs, sends) share the GIL with its background
    compute (the next charge composed ahead, the last one checked while the job fits). At
    CPython's default 5 ms switch interval, every fsync or send waits up to 5 ms to get the GIL
    back from such a thread (docs/results.md, "Service overhead"); a 0.5 ms interval keeps
    them responsive. Process-wide, only ever lowered."""
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)


def settle_heap() -> None:
    """Collect once, then freeze what survives (``gc.freeze``): the modules, data and caches a
    process keeps for its lifetime leave the cyclic collector's view, so a full collection
    during a job scans only what the job allocated (what a full collection costs a job:
    docs/results.md, "Service overhead"). Objects freed by reference counting
    are freed as before; cycles among frozen objects are never collected, so this is called
    once, after start-up, by a process's entry point (the daemons, ``dpda target run``)."""
    gc.collect()
    gc.freeze()
