"""``dpda bench``: the benchmarks are part of the checkout (``tests/bench``), not of the
installed package, so no daemon host carries them or their flood generator. In a checkout
installed as the README says, the package's files are links into the checkout, and the command
tree comes from there; elsewhere ``dpda bench`` says where the benchmarks are."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

import dpda


def checkout() -> Path | None:
    """The checkout the installed package's files come from, when it holds the benchmarks."""
    root = Path(dpda.__file__).resolve().parents[1]
    if (root / "tests" / "bench" / "harness.py").is_file() and (root / "pyproject.toml").is_file():
        return root
    return None


def _no_checkout(args: argparse.Namespace) -> int:
    print(
        "dpda bench: the benchmarks come with a checkout of dpda (tests/bench), not with the "
        "installed package; in the checkout: pip install -e '.[test]' "
        "--config-settings editable_mode=strict, then dpda bench …",
        file=sys.stderr,
    )
    return 2


def register(sub: argparse._SubParsersAction) -> None:
    root = checkout()
    if root is None:
        b = sub.add_parser("bench", help="benchmarks (from a checkout of dpda)")
        b.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        b.set_defaults(func=_no_checkout)
        return
    if str(root) not in sys.path:
        sys.path.insert(0, str(root))
    importlib.import_module("tests.bench.harness").register(sub)
