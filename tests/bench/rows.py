"""``dpda bench scale --rows N …``: wall time and peak memory of ``dpda simulate`` as the rows
grow, on synthetic 10-class tables of 64 columns (N source and N target rows).

Two runs at each N, each ``dpda simulate`` as a process of its own reading Parquet tables:

* **rehearsal**: the target's table carries its labels, so the non-private references run
  beside the job (source-only 1-NN on every row, OTDA on its stated subsample,
  ``dpda.ot.references``);
* **job**: the target's table has no labels: the references are skipped and what runs is the
  job alone (the source's releases, the fits onto every target row, the label-free selection,
  the arm without adaptation, the classifier).

Peak memory is the child's maximum resident set (``wait4``'s ``ru_maxrss``, what
``/usr/bin/time -v`` reports), the tables themselves included.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CLASSES, COLUMNS = 10, 64
ROWS = (10_000, 100_000, 1_000_000)
REHEARSAL_MAX = 100_000  # the rehearsal's 1-NN reference grows as ns × nt in time


def synthetic_tables(
    n: int, seed: int = 0, n_source: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(source, target) float32 tables of ``n_source`` (default ``n``) and ``n`` rows: 64
    columns then the label (10 classes, overlapping Gaussian clusters; the target's columns
    shifted and scaled)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 0.45, (CLASSES, COLUMNS))
    shift = rng.normal(0.0, 0.5, COLUMNS)
    rows = {False: n if n_source is None else n_source, True: n}

    def side(which: int, target: bool) -> np.ndarray:
        size = rows[target]
        r = np.random.default_rng([seed, which])
        y = r.integers(0, CLASSES, size)
        out = np.empty((size, COLUMNS + 1), dtype=np.float32)
        out[:, :COLUMNS] = r.standard_normal((size, COLUMNS), dtype=np.float32)
        out[:, :COLUMNS] += centres[y]
        if target:
            out[:, :COLUMNS] = out[:, :COLUMNS] * 1.3 + shift
        out[:, COLUMNS] = y
        return out

    return side(1, False), side(2, True)


def write_parquet(path: Path, table: np.ndarray, labeled: bool) -> None:
    """``table`` as Parquet: columns ``f0 … f63``, then ``label`` when ``labeled``."""
    import pandas as pd

    cols = {f"f{i}": table[:, i] for i in range(COLUMNS)}
    if labeled:
        cols["label"] = table[:, COLUMNS].astype(np.int64)
    pd.DataFrame(cols).to_parquet(path, index=False)


def _simulate(argv: list[str]) -> tuple[int, float, float, str]:
    """``dpda simulate argv`` as a process of its own: (exit status, wall seconds, its peak
    resident memory in MB, what it wrote on standard error)."""
    code = "import sys; from dpda.cli.main import main; sys.exit(main(sys.argv[1:]))"
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(
            [sys.executable, "-c", code, *argv], stdout=subprocess.DEVNULL, stderr=err
        )
        _, status, usage = os.wait4(p.pid, 0)
        seconds = time.perf_counter() - t0
        p.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        text = err.read().decode(errors="replace")
    return p.returncode, seconds, usage.ru_maxrss / 1024.0, text


def measure(
    n: int, kind: str, workdir: Path, seed: int = 0, n_source: int | None = None
) -> dict[str, Any]:
    """One ``dpda simulate`` run on ``n`` target rows (and ``n_source``, default ``n``, source
    rows): ``kind`` rehearsal (a labeled target) or job (an unlabeled one)."""
    ns = n if n_source is None else n_source
    src, tgt = synthetic_tables(n, seed, ns)
    s_path, t_path = workdir / f"source{ns}.parquet", workdir / f"target{n}_{kind}.parquet"
    if not s_path.exists():
        write_parquet(s_path, src, True)
    write_parquet(t_path, tgt, kind == "rehearsal")
    del src, tgt
    out_json = workdir / f"{kind}{n}.json"
    argv = [
        "simulate", "--source-file", str(s_path), "--target-file", str(t_path),
        "--label-column", "label", "--seed", str(seed), "--json", str(out_json),
        "--predictions", str(workdir / f"{kind}{n}.csv"),
    ]  # fmt: skip
    load = os.getloadavg()[0]
    rc, seconds, peak, err = _simulate(argv)
    data = json.loads(out_json.read_text()) if rc == 0 else {}
    for p in (t_path, out_json, workdir / f"{kind}{n}.csv"):
        p.unlink(missing_ok=True)
    d = data
    return {
        "kind": kind,
        "rows": n,
        "source_rows": ns,
        "columns": COLUMNS,
        "rc": rc,
        "error": err[-2000:] if rc else None,
        "seconds": seconds,
        "peak_mb": peak,
        "table_mb": (ns + n) * (COLUMNS + 1) * 4 / 2**20,  # the two tables in float32
        "load_before": load,
        "load_after": os.getloadavg()[0],
        "accuracy": d.get("accuracy"),
        "references": d.get("references"),
    }


def growth(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per kind, the exponent of each quantity's growth between its smallest and largest N
    (``log(ratio) / log(N ratio)``: 1 is linear, 2 quadratic)."""
    out: dict[str, dict[str, float]] = {}
    for kind in ("rehearsal", "job"):
        ok = [r for r in rows if r["kind"] == kind and r["rc"] == 0]
        rs = sorted(ok, key=lambda r: r["rows"])
        if len(rs) < 2:
            continue
        lo, hi = rs[0], rs[-1]
        span = np.log(hi["rows"] / lo["rows"])
        out[kind] = {
            "from_rows": lo["rows"],
            "to_rows": hi["rows"],
            "seconds_exponent": float(np.log(hi["seconds"] / lo["seconds"]) / span),
            "peak_mb_exponent": float(np.log(hi["peak_mb"] / lo["peak_mb"]) / span),
        }
    return out


def run_rows(args: argparse.Namespace) -> int:
    from dpda.service.output import write_json

    sizes = list(args.rows or ROWS)
    kinds = args.kinds
    print(
        f"dpda simulate on synthetic {CLASSES}-class tables, {COLUMNS} columns, "
        f"{args.source_rows or 'N'} source and N target rows; rehearsal (labeled target: "
        "references run) up to N = "
        f"{args.rehearsal_max}, job (unlabeled target) at every N; load "
        f"{os.getloadavg()[0]:.1f}",
        flush=True,
    )
    print(f"{'kind':>9} {'N':>9} {'seconds':>9} {'peak MB':>9} {'accuracy':>9}", flush=True)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="dpda-rows-") as tmp:
        for n in sizes:
            for kind in kinds:
                if kind == "rehearsal" and n > args.rehearsal_max:
                    continue
                r = measure(n, kind, Path(tmp), args.seed, args.source_rows)
                rows.append(r)
                acc = (r["accuracy"] or {}).get("dpda")
                print(
                    f"{kind:>9} {n:>9} {r['seconds']:>9.1f} {r['peak_mb']:>9.0f} "
                    f"{'' if acc is None else f'{acc:.2f}':>9}",
                    flush=True,
                )
                if args.json not in (None, "-"):  # a long run keeps what it has measured
                    write_json(args, {"rows": rows, "growth": growth(rows), "complete": False})
    g = growth(rows)
    for kind, v in g.items():
        print(
            f"{kind}: from N = {v['from_rows']} to {v['to_rows']}, time grows as "
            f"N^{v['seconds_exponent']:.2f}, peak memory as N^{v['peak_mb_exponent']:.2f}"
        )
    write_json(args, {"rows": rows, "growth": g, "complete": True, "cpus": os.cpu_count()})
    return 0 if all(r["rc"] == 0 for r in rows) else 1
