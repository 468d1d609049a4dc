"""``dpda bench releases``: how long one record-level release takes at the source.

Each release kind is timed through ``SourceReleaser.release`` (charge, then the draw: features
prepared and projected, the mechanism, the payload hash) on generated data with Office-Caltech's
shape (800 features, 10 classes, ℓ = 50) at each ``--rows``, in the same run and on the same
data as prototypes (the in-process baseline: one noisy sum per class). The first release of a
session also prepares the source's features; that is timed too, once, as ``first``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np

from dpda.dp.mechanisms import AGGREGATE_RELEASES
from dpda.service.output import add_json_option, write_json


def _time_release(n: int, k: int, q: int, ell: int, release: str, repeats: int) -> dict[str, Any]:
    from dpda.data.loaders import Domain
    from dpda.data.preprocessing import Scaling
    from dpda.dp.ledger import Budget, MemoryLedgerStore, PrivacyLedger
    from dpda.protocol import TargetDisclosure
    from dpda.source_party.releases import SourceReleaser
    from dpda.terms import SessionTerms

    rng = np.random.default_rng(0)
    y = np.arange(n) % q
    x = rng.normal(size=(n, k)) + 3.0 * np.eye(q, k)[y]
    basis, _ = np.linalg.qr(rng.normal(size=(k, ell)))
    times, first = [], None
    for r in range(repeats + 1):
        ledger = PrivacyLedger(MemoryLedgerStore(), {"d": Budget(1000.0, 1e-6)})
        src = SourceReleaser(Domain("d", x, y, q), "d", ledger, np.random.default_rng(r))
        terms = SessionTerms.model_validate(
            {
                "dataset": "d",
                "epsilon": 8.0,
                "delta": 1e-6,
                "projection": "target-pca",
                "projection_dim": ell,
                "release": release,
            }
        )
        info = src.open_session(terms, TargetDisclosure(Scaling(np.zeros(k), np.ones(k)), basis))
        if r == 0:
            t0 = time.perf_counter()
            src.release(info.session_id, 0)  # prepares the features too
            first = time.perf_counter() - t0
            continue
        src.features(info.session_id)  # cached, as in a daemon serving its second session
        t0 = time.perf_counter()
        rel = src.release(info.session_id, 0)
        times.append(time.perf_counter() - t0)
    return {
        "rows": n,
        "release": release,
        "seconds_median": statistics.median(times),
        "seconds_first": first,
        "points_released": int(rel.z.shape[0]),
        "repeats": repeats,
    }


def run_bench_releases(args: argparse.Namespace) -> int:
    rows: list[dict[str, Any]] = []
    print(f"{'rows':>8s} {'release':>20s} {'median s':>10s} {'first s':>9s} {'× prototypes':>13s}")
    for n in args.rows:
        base = None
        for release in args.releases:
            r = _time_release(n, args.features, args.classes, args.dim, release, args.repeats)
            if release == "prototypes":
                base = r["seconds_median"]
            r["vs_prototypes"] = None if base is None else r["seconds_median"] / base
            rows.append(r)
            ratio = "" if r["vs_prototypes"] is None else f"{r['vs_prototypes']:.1f}"
            print(
                f"{n:8d} {release:>20s} {r['seconds_median']:10.4f} "
                f"{r['seconds_first']:9.3f} {ratio:>13s}"
            )
    write_json(args, {"features": args.features, "classes": args.classes, "runs": rows})
    return 0


def register_releases(bsub: argparse._SubParsersAction) -> None:
    s = bsub.add_parser(
        "releases", help="time of one record-level release at the source, per kind and size"
    )
    s.add_argument(
        "--rows",
        type=int,
        nargs="+",
        default=[1123, 20000],
        help="source rows per run (default 1123 20000)",
    )
    s.add_argument(
        "--releases",
        nargs="+",
        choices=AGGREGATE_RELEASES,
        default=list(AGGREGATE_RELEASES),
        help="prototypes first: the others are compared with it",
    )
    s.add_argument("--features", type=int, default=800, help="features per row (default 800)")
    s.add_argument("--classes", type=int, default=10, help="classes (default 10)")
    s.add_argument("--dim", type=int, default=50, help="ℓ, the projected dimension")
    s.add_argument(
        "--repeats",
        type=int,
        default=5,
        help="timed runs per kind and size; the median is reported (default 5)",
    )
    add_json_option(s)
    s.set_defaults(func=run_bench_releases)
