"""What solves and fits read: one value, summed with ``+``."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class Traffic:
    """Kernel builds, passes over a kernel (one per Sinkhorn iteration) and bytes of plan-sized
    arrays read, by one solve, one fit or a job's fits summed (``a + b``).

    Attributes
    ----------
    kernel_builds : int
        Kernels ``exp(−M/λ)`` built.
    passes : int
        Passes over a kernel: one per Sinkhorn iteration.
    bytes_read : int
        Bytes of plan-sized arrays read (the solver's passes, the cost, the products with the
        plan).
    pass_bytes : int
        What the passes alone must read: passes × the plan's bytes (a fit's; 0 for a solve).
    fits : int
        Fits counted (0 for a solve, 1 for a fit).
    seconds : float
        The fits' own time, where they ran (0 for a solve).
    """

    kernel_builds: int = 0
    passes: int = 0
    bytes_read: int = 0
    pass_bytes: int = 0
    fits: int = 0
    seconds: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def to_json(self) -> dict[str, float]:
        """Per fit: what ``dpda bench speed --visda`` and ``dpda bench scale`` print beside the
        bytes-over-bandwidth bound."""
        per = max(self.fits, 1)
        return {
            "fits": self.fits,
            "kernel_builds_per_fit": self.kernel_builds / per,
            "passes_per_fit": self.passes / per,
            "bytes_read_per_fit": self.bytes_read / per,
            "pass_bytes_per_fit": self.pass_bytes / per,
            "read_over_pass_bytes": self.bytes_read / max(self.pass_bytes, 1),
            "seconds_per_fit": self.seconds / per,
        }
