"""``dpda bench metric``'s toy (the paper's §VII-A): the pair graph, the three schemes, the PNG."""

from __future__ import annotations

import numpy as np
import pytest

from tests.bench import metric as B


def test_the_toy_pairs_are_acyclic_with_the_papers_counts() -> None:
    x, y = B.toy_data(0)
    assert x.shape == (200, 2) and np.bincount(y).tolist() == [100, 100]
    pairs = B.toy_pairs(y, 0)
    same = y[pairs[:, 0]] == y[pairs[:, 1]]
    assert pairs.shape == (150, 2) and same.sum() == 100 and (~same).sum() == 50
    assert np.sum(same & (y[pairs[:, 0]] == 0)) == 50
    # a forest: every edge joins two components (edges = nodes − components)
    parent = list(range(200))

    def root(i: int) -> int:
        while parent[i] != i:
            i = parent[i]
        return i

    for a, b in pairs:
        ra, rb = root(int(a)), root(int(b))
        assert ra != rb
        parent[ra] = rb


@pytest.mark.slow
def test_the_toy_runs_and_draws(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "toy.png"
    out = B.run_toy(0, str(png))
    runs = {r["scheme"]: r for r in out["runs"]}
    assert set(runs) == {"nonpriv", "dpp", "dpp-s"}
    steps = B.TOY["epochs"] * -(-150 // B.TOY["batch"])
    assert all(len(r["loss"]) == steps for r in runs.values())
    assert runs["nonpriv"]["loss"][-1] < runs["nonpriv"]["loss"][0]
    # DP: the pair-level sensitivity 2h/|B| (150 pairs: five full batches of 30 per epoch);
    # the paper's reduction never exceeds it
    sens = np.array(runs["dpp"]["sensitivity"])
    assert np.allclose(sens, 2 * B.TOY["h"] / B.TOY["batch"])
    assert np.all(np.array(runs["dpp-s"]["sensitivity"]) <= sens + 1e-12)
    assert png.stat().st_size > 10_000
