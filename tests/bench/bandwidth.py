"""The machine's memory bandwidth and Sinkhorn's share of it: the bound ``dpda bench speed`` and
``dpda bench scale`` compare the fits' kernel reads with."""

from __future__ import annotations

import time
import warnings


def memory_bandwidth_gbs(mb: int = 1024, repeats: int = 5) -> dict[str, float]:
    """Best-of-``repeats`` read and copy bandwidth of this machine in GB/s, one thread per core
    (numpy releases the GIL), on arrays far larger than the last-level cache."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    workers = max(os.cpu_count() or 1, 1)
    x = np.ones(mb * 2**20 // 8, dtype=np.float64)
    y = np.empty_like(x)
    parts = np.array_split(np.arange(x.size), workers)
    spans = [(int(p[0]), int(p[-1]) + 1) for p in parts]
    read, copy = 0.0, 0.0
    with ThreadPoolExecutor(workers) as pool:
        for _ in range(repeats):
            t0 = time.perf_counter()
            list(pool.map(lambda s: np.add.reduce(x[s[0] : s[1]]), spans))
            read = max(read, x.nbytes / (time.perf_counter() - t0) / 1e9)
            t0 = time.perf_counter()
            list(pool.map(lambda s: np.copyto(y[s[0] : s[1]], x[s[0] : s[1]]), spans))
            copy = max(copy, 2 * x.nbytes / (time.perf_counter() - t0) / 1e9)
    return {"read_gbs": read, "copy_gbs": copy, "threads": workers}


def sinkhorn_throughput(n: int = 8000, iters: int = 20) -> dict[str, float]:
    """Bytes of kernel read per second by our Sinkhorn iteration (two passes) and POT's."""
    import numpy as np
    import ot

    from dpda.ot import fast

    rng = np.random.default_rng(0)
    k32 = rng.random((n, n), dtype=np.float32) + 0.5
    a = np.full(n, 1.0 / n)
    t0 = time.perf_counter()
    fast.sinkhorn_scalings(k32, a, a, np.ones(n), iters, 0.0)
    ours = 2 * k32.nbytes * iters / (time.perf_counter() - t0) / 1e9
    # POT: ot.sinkhorn on a cost whose kernel is the same matrix, float64, no early stop
    m64 = -np.log(k32.astype(np.float64))
    del k32
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "did not converge": it is stopped on purpose
        ot.sinkhorn(a, a, m64, 1.0, numItermax=iters, stopThr=0.0)
    pot = 2 * m64.nbytes * iters / (time.perf_counter() - t0) / 1e9
    return {"ours_gbs": ours, "pot_gbs": pot, "n": n}


def bandwidth_child(n: int, conn) -> None:
    out = memory_bandwidth_gbs()
    out.update(sinkhorn_throughput(n))
    conn.send(out)
    conn.close()
