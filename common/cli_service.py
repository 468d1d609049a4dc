"""Subcommands of the two daemons and their state (keys, serve, run, ledger, audit, bench)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the service subcommands to the ``dpda`` parser."""
    return None
