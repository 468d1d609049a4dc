"""Infrastructure both daemons share: wire (de)serialization, TLS and pinning, admission,
signatures, the audit log, the admin API, configuration, key files, crash points, progress."""

import sys

SWITCH_INTERVAL_S = 0.0005  # CPython's default is 0.005


def responsive_io_threads() -> None:
    """A party's I/O threads (gRPC handlers, fsyncs, sends) share the GIL with its background
    compute (the next charge composed ahead, the last one checked while the job fits). At
    CPython's default 5 ms switch interval, every fsync or send waits up to 5 ms to get the GIL
    back from such a thread (measured: audit appends of 11–16 ms instead of 1 ms during a
    composition); a 0.5 ms interval keeps them responsive. Process-wide, only ever lowered."""
    if sys.getswitchinterval() > SWITCH_INTERVAL_S:
        sys.setswitchinterval(SWITCH_INTERVAL_S)
