"""The benchmarks' harness: the ``dpda bench`` command tree, the flags its programs share
(declared here once), and what their worker processes start with.

The benchmarks live in the checkout, not in the installed package: ``dpda bench`` finds them
beside the package's own source (``dpda.cli.bench``) after the README's test install.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]  # the checkout: ``tests.bench`` imports from here
# the benchmark pairs (source, target): Office-Caltech's 12 and the digits' 2
OFFICE = [(s, t) for s in "CADW" for t in "CADW" if s != t]
DIGITS = [("M", "U"), ("U", "M")]


def add_data_dir(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-dir", default=None, help="benchmark data (default $DPDA_DATA)")


def add_pairs(p: argparse.ArgumentParser, default: list[str] | None = None) -> None:
    """``--pairs`` like ``C:A M:U``: ``default`` None means every benchmark pair."""
    said = "all 14" if default is None else " ".join(default)
    p.add_argument(
        "--pairs", nargs="*", default=default, help=f"pairs like C:A M:U (default: {said})"
    )


def parse_pairs(spec: list[str] | None) -> list[tuple[str, str]]:
    """``--pairs``' value as (source, target) letters; None, empty or ``all``: every pair."""
    if not spec or spec == ["all"]:
        return OFFICE + DIGITS
    out = []
    for item in spec:
        s, _, t = item.replace("→", ":").partition(":")
        if not s or not t or s == t or (s in "MU") != (t in "MU"):
            raise ValueError(f"--pairs: {item!r} is not a pair like C:A or M:U")
        out.append((s.upper(), t.upper()))
    return out


def add_seeds(p: argparse.ArgumentParser, default: int, per: str = "pair") -> None:
    p.add_argument(
        "--seeds", type=int, default=default, help=f"seeds per {per} (default {default})"
    )


def add_jobs(p: argparse.ArgumentParser, default: int = 0) -> None:
    said = "one per core" if default == 0 else str(default)
    p.add_argument("--jobs", type=int, default=default, help=f"worker processes (default: {said})")


def worker_init() -> None:
    """A pool worker's start: one BLAS thread, so that the pool's workers share the cores
    instead of oversubscribing them."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(1)


def gather(tasks: list[Any], label: str) -> list[Any]:
    """Results of submitted futures in submission order, with a progress bar."""
    from dpda.service.progress import Progress

    bar = Progress(label)
    rows = []
    for i, f in enumerate(tasks):
        rows.append(f.result())
        bar(i + 1, len(tasks))
    return rows


def cell(v: float | None, digits: int = 1) -> str:
    """A table's number, ``—`` where there is none."""
    return "—" if v is None else f"{v:.{digits}f}"


def child_env() -> dict[str, str]:
    """The environment of a fresh interpreter that imports ``tests.bench``: the checkout on
    its path."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    return env


def register(sub: argparse._SubParsersAction) -> None:
    """``dpda bench`` and each benchmark under it."""
    from tests.bench.accuracy import register_accuracy
    from tests.bench.figures import register_figures
    from tests.bench.load import register_load
    from tests.bench.metric import register_metric
    from tests.bench.privacy import register_privacy
    from tests.bench.public_source import register_public_source
    from tests.bench.releases import register_releases
    from tests.bench.scale import register_scale
    from tests.bench.selection import register_selection
    from tests.bench.service import register_service
    from tests.bench.speed import register_speed
    from tests.bench.target_privacy import register_target_privacy

    b = sub.add_parser("bench", help="benchmarks that print numbers and write JSON")
    bsub = b.add_subparsers(dest="bench_command", required=True)
    for add in (
        register_service, register_speed, register_accuracy, register_figures,
        register_privacy, register_selection, register_load, register_releases,
        register_public_source, register_target_privacy, register_scale, register_metric,
    ):  # fmt: skip
        add(bsub)
