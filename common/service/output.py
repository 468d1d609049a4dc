"""One meaning for ``--json`` in every command: ``--json OUT`` writes the results to the file OUT,
``--json -`` (or ``--json`` alone) prints them on standard output — and then everything else the
command says goes to standard error, so the output is JSON and nothing else."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def add_json_option(parser: argparse.ArgumentParser, what: str = "the results") -> None:
    parser.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="OUT",
        help=f"write {what} as JSON to the file OUT; '-' or no value: standard output only",
    )


def json_to_stdout(args: argparse.Namespace) -> bool:
    return getattr(args, "json", None) == "-"


def write_json(args: argparse.Namespace, data: Any) -> None:
    """Write ``data`` where ``--json`` says (nothing without it). For ``-`` it goes to the
    standard output the command started with (``main`` points the rest at standard error)."""
    dest = getattr(args, "json", None)
    if dest is None:
        return
    text = json.dumps(data, indent=2)
    if dest == "-":
        stream = getattr(args, "json_stream", None) or sys.stdout
        stream.write(text + "\n")
        stream.flush()
        return
    Path(dest).write_text(text + "\n")
    print(f"wrote {dest}", file=sys.stderr)
