"""The in-process engine, the memory split of a batch and ``[compute]`` (issue 18); no Dask."""

from __future__ import annotations

import numpy as np
import pytest

from dpda.data.preprocessing import Scaling
from dpda.errors import ConfigError
from dpda.ot.costs import dpot_cost
from dpda.ot.mapping import barycentric_map
from dpda.ot.solvers import one_hot, sinkhorn_group_lasso, uniform
from dpda.service.config import ComputeConfig
from dpda.target_party.compute import (
    BYTES_PER_CELL,
    WORKER_SHARE,
    Compute,
    parse_bytes,
    spec_of,
    split_rows,
)
from dpda.target_party.fitting import combine, fit_piece
from dpda.target_party.view import AdaptConfig, TargetView


def test_split_rows_covers_every_point_once_within_the_limit():
    assert split_rows(1000, 50_000, None) == [(0, 1000)]
    assert split_rows(1000, 50_000, 10**9) == [(0, 1000)]
    for n, m, cells in ((1000, 50_000, 12_500_000), (7, 100, 300), (1001, 3, 1000)):
        spans = split_rows(n, m, cells)
        assert len(spans) > 1
        assert spans[0][0] == 0 and spans[-1][1] == n
        assert all(a[1] == b[0] for a, b in zip(spans, spans[1:], strict=False))
        assert all((j - i) * m <= cells for i, j in spans)


def test_max_cells_from_the_memory_of_a_worker():
    assert Compute().max_cells() is None
    four_gib = 4 * 2**30
    assert Compute(four_gib).max_cells() == int(four_gib * WORKER_SHARE) // BYTES_PER_CELL


def test_parse_bytes_and_config_name_the_field():
    assert parse_bytes("4GiB") == 4 * 2**30
    assert parse_bytes("512mb") == 512 * 2**20
    with pytest.raises(ConfigError, match="compute.memory_per_worker"):
        parse_bytes("1kb")
    spec = spec_of(
        ComputeConfig(
            scheduler="tcp://10.0.0.5:8786",
            memory_per_worker="2GiB",
            allow_unauthenticated_scheduler=True,
        )
    )
    assert spec.memory_per_worker == 2 * 2**30 and spec.threads_per_worker == 1
    with pytest.raises(ValueError, match="scheduler"):
        ComputeConfig(scheduler="http://x:1")
    with pytest.raises(ValueError, match="memory_per_worker"):
        ComputeConfig(memory_per_worker="lots")


def test_a_scheduler_without_tls_needs_an_opt_in_that_says_what_it_gives_up():
    with pytest.raises(ValueError, match="allow_unauthenticated_scheduler"):
        ComputeConfig(scheduler="tcp://10.0.0.5:8786")
    with pytest.raises(ValueError, match="tls_ca_file"):
        ComputeConfig(scheduler="tls://10.0.0.5:8786")
    ok = ComputeConfig(scheduler="tls://10.0.0.5:8786", tls_ca_file="ca", tls_cert="c", tls_key="k")
    assert spec_of(ok).tls == ("ca", "c", "k")


def _plan(pts, ys, a, xt_proj, cfg):
    """The plan ``fit_points`` solves (the same cost and solver), for checking ``combine``."""
    cost = dpot_cost(pts, xt_proj, 0.1, None)
    b = uniform(xt_proj.shape[0])
    res = sinkhorn_group_lasso(
        a,
        b,
        cost.normalized,
        ys,
        cfg.reg_e,
        cfg.reg_g,
        inner_tol=cfg.inner_tol,
        stop_thr=cfg.outer_tol,
    )
    return res.plan.astype(np.float64)


def test_combine_puts_the_pieces_of_a_release_back_together(rng):
    """Two pieces (each a transport of part of the points, mass 1 each) combine into one fit
    whose images, labels and points are the pieces' in order, and whose class masses and
    back-mapped target rows are those of the pieces' plans stacked into one n × m plan (each
    scaled by its piece's mass share) — checked against that stacked plan."""
    n, m = 40, 30
    xt = rng.normal(size=(m, 6))
    view = TargetView(xt, Scaling.of(xt, "zscore"), None, np.full(m, -1))
    pts = rng.normal(size=(n, 3))
    ys = np.arange(n) % 3
    a = np.full(n, 1.0 / n)
    cfg = AdaptConfig()
    halves = [(0, 25), (25, 40)]
    parts = [(pts[i:j], ys[i:j], a[i:j] / a[i:j].sum()) for i, j in halves]
    pieces = [fit_piece(p, y, w, 0.1, xt[:, :3], view, cfg, 3, None) for p, y, w in parts]
    shares = [float(a[i:j].sum()) for i, j in halves]
    whole = combine(pieces, shares, a)
    assert whole.mapped.shape == (n, 6) and np.array_equal(whole.labels, ys)
    assert np.array_equal(whole.points, pts) and np.array_equal(whole.weights, a)
    stacked = np.vstack(
        [s * _plan(p, y, w, xt[:, :3], cfg) for (p, y, w), s in zip(parts, shares, strict=True)]
    )
    assert np.allclose(whole.class_mass, one_hot(ys, 3).T @ stacked, atol=1e-6)
    assert np.allclose(whole.back_mapped, barycentric_map(stacked.T, pts), atol=1e-5)
    # one piece is returned as it is
    assert combine(pieces[:1], [1.0], a[:25]) is pieces[0]


def test_a_session_without_pate_queries_makes_no_back_maps(rng):
    """The back-maps serve PATE's queries only: a fit asked without them has none, and a
    release put back together from such pieces has none; its images are the same."""
    n, m = 40, 30
    xt = rng.normal(size=(m, 6))
    view = TargetView(xt, Scaling.of(xt, "zscore"), None, np.full(m, -1))
    pts, ys, a = rng.normal(size=(n, 3)), np.arange(n) % 3, np.full(n, 1.0 / n)
    cfg = AdaptConfig()
    with_back = fit_piece(pts, ys, a, 0.1, xt[:, :3], view, cfg, 3, None)
    without = fit_piece(pts, ys, a, 0.1, xt[:, :3], view, cfg, 3, None, back_map=False)
    assert with_back.back_mapped is not None and without.back_mapped is None
    assert np.array_equal(with_back.mapped, without.mapped)
    assert combine([without, without], [0.5, 0.5], a).back_mapped is None
