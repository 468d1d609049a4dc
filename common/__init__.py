"""dpda shared library: privacy mechanisms and accounting, OT, data, protocol helpers."""

__version__ = "0.1.0"
