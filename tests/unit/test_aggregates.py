"""Record-level aggregate releases: noise against the ledger, clipping, parallel composition."""

from __future__ import annotations

import numpy as np
import pytest

from dpda.data.loaders import Domain
from dpda.data.preprocessing import Scaling
from dpda.dp.accounting import epsilon_of
from dpda.dp.events import event_from_json
from dpda.dp.ledger import Budget
from dpda.protocol import TargetDisclosure
from dpda.target_party.pipeline import aggregate_points
from dpda.terms import SessionTerms
from tests.support import memory_releaser

from .noise_checks import std_matches


def _release(
    x: np.ndarray,
    y: np.ndarray,
    q: int,
    release: str,
    epsilon: float = 4.0,
    clip: float = 1.0,
    ell: int = 20,
):
    k = x.shape[1]
    rel, ledger = memory_releaser(
        Domain("d", x, y, q), "d", Budget(100, 1e-5), np.random.default_rng(3)
    )
    terms = SessionTerms(
        dataset="d",
        epsilon=epsilon,
        delta=1e-5,
        projection="target-pca",
        projection_dim=ell,
        privacy_unit="record",
        release=release,
        clip_norm=clip,
    )
    basis = np.eye(k)[:, :ell]
    info = rel.open_session(terms, TargetDisclosure(Scaling(np.zeros(k), np.ones(k)), basis))
    return rel.release(info.session_id, 0), ledger.store.entries("d")[-1], terms


@pytest.mark.parametrize("release", ["prototypes", "class-gaussians"])
def test_noise_matches_the_ledger(release: str) -> None:
    q = 600  # all-zero rows: every released sum is pure noise; 600 × 20 (or 40) values
    x, y = np.zeros((1200, 30)), np.arange(1200) % q
    b, entry, _ = _release(x, y, q, release)
    f = entry.params["spec"]["features"]
    claimed = f["noise_multiplier"] * f["sensitivity"]
    noise = b.z  # all-zero data and C = 1: every released value is noise in the spec's units
    # replace-one: a class sum moves by ≤ 2C (r → −r); the class-gaussians block by ≤ √6
    assert f["sensitivity"] == pytest.approx(2.0 if release == "prototypes" else np.sqrt(6))
    assert std_matches(noise, claimed)
    assert not std_matches(noise, claimed * 0.7)
    assert not std_matches(noise, claimed * 1.3)


def test_rows_are_clipped_before_summing() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 30)) * 100.0  # norms far above C
    y = rng.integers(0, 3, size=300)
    b, _, _ = _release(x, y, 3, "prototypes", epsilon=50.0, clip=2.0)
    counts = np.bincount(y, minlength=3)
    # a class sum of clipped rows has norm ≤ count·C; the noise at ε = 50 is tiny next to that
    norms = np.linalg.norm(b.z, axis=1)
    assert np.all(norms <= counts * 2.0 * 1.02 + 1.0)
    unclipped = np.array(
        [np.linalg.norm((x[y == c] @ np.eye(30)[:, :20]).sum(0)) for c in range(3)]
    )
    assert np.all(norms < unclipped / 5)


def test_parallel_composition_only_across_disjoint_classes() -> None:
    # the charge for q disjoint class sums is one Gaussian + one histogram, whatever q is
    rng = np.random.default_rng(1)
    charges = []
    for q in (2, 10):
        x, y = rng.normal(size=(200, 30)), np.arange(200) % q
        _, entry, terms = _release(x, y, q, "prototypes")
        charges.append(epsilon_of([event_from_json(entry.dp_event)], terms.delta))
        assert np.bincount(y, minlength=q).sum() == 200  # every record in exactly one class
    assert charges[0] == pytest.approx(charges[1])
    assert charges[0] <= 4.0


def test_aggregate_points_post_processing() -> None:
    from dpda.protocol import BatchRelease

    sums = np.array([[2.0, 4.0], [0.0, 0.0], [9.0, 3.0]])
    rel = BatchRelease(0, sums, np.array([2, -1, 3]), None, 0)  # type: ignore[arg-type]
    pts, labels, w = aggregate_points(rel, "prototypes", 3, 0, 10)
    assert labels.tolist() == [0, 2]  # a class with a non-positive noisy count is dropped
    assert np.allclose(pts, [[1.0, 2.0], [3.0, 1.0]]) and np.isclose(w.sum(), 1.0)


def test_aggregates_need_the_record_unit() -> None:
    with pytest.raises(ValueError, match="release"):
        SessionTerms(
            dataset="d", epsilon=1, delta=1e-5, privacy_unit="attribute", release="prototypes"
        )


# ------------------------------------------------------------------ the source's own space
@pytest.mark.parametrize(
    ("asked", "projection"),
    [
        ({}, "source"),
        ({"release": "class-gaussians"}, "source"),
        ({"release": "sinkhorn-synthetic"}, "target-pca"),
        ({"privacy_unit": "attribute"}, "target-pca"),
        ({"pate_epsilon": 1.0, "pate_queries": 10}, "target-pca"),
    ],
)
def test_aggregate_releases_default_to_the_sources_own_space(asked, projection) -> None:
    terms = SessionTerms(dataset="d", epsilon=4.0, delta=1e-5, **asked)
    assert terms.projection == projection


@pytest.mark.parametrize(
    "asked",
    [
        {"release": "sinkhorn-synthetic"},
        {"privacy_unit": "attribute"},
        {"pate_epsilon": 1.0, "pate_queries": 10},
    ],
)
def test_the_source_space_is_refused_where_the_release_needs_a_shared_basis(asked) -> None:
    with pytest.raises(ValueError, match="projection: 'source' serves"):
        SessionTerms(dataset="d", epsilon=4.0, delta=1e-5, projection="source", **asked)


def test_a_source_space_release_is_class_sums_of_the_sources_own_rows() -> None:
    """Full dimension, rows clipped to C in the source's per-row space, no target input: the
    noise is the spec's σ·2C on every one of the k coordinates."""
    rng = np.random.default_rng(0)
    q, k = 1000, 12
    x, y = np.zeros((2000, k)), np.arange(2000) % q
    rel, ledger = memory_releaser(Domain("d", x, y, q), "d", Budget(100, 1e-5), rng)
    terms = SessionTerms(dataset="d", epsilon=4.0, delta=1e-5, clip_norm=0.5)
    info = rel.open_session(terms, TargetDisclosure(None, None))
    b = rel.release(info.session_id, 0)
    assert b.z.shape == (q, k)
    f = ledger.store.entries("d")[-1].params["spec"]["features"]
    assert f["sensitivity"] == pytest.approx(2 * 0.5)
    assert std_matches(b.z, f["noise_multiplier"] * f["sensitivity"])
    # the signal is the clipped class sum: rows of norm 10 count as norm C
    x2 = np.zeros((2000, k))
    x2[:, 0] = 10.0
    rel2, _ = memory_releaser(Domain("d", x2, y, q), "d", Budget(100, 1e-5), rng)
    info2 = rel2.open_session(terms, TargetDisclosure(None, None))
    z = rel2.release(info2.session_id, 0).z
    assert np.mean(z[:, 0]) == pytest.approx(2 * 0.5, abs=0.3)  # two rows of norm C a class


def test_a_source_space_session_refuses_a_scaling_or_basis_from_the_target() -> None:
    from dpda.errors import InvalidInput

    x, y = np.zeros((40, 5)), np.arange(40) % 2
    rel, ledger = memory_releaser(
        Domain("d", x, y, 2), "d", Budget(100, 1e-5), np.random.default_rng(1)
    )
    terms = SessionTerms(dataset="d", epsilon=4.0, delta=1e-5)
    for disclosure in (
        TargetDisclosure(Scaling(np.zeros(5), np.ones(5)), None),
        TargetDisclosure(None, np.eye(5)[:, :2]),
    ):
        with pytest.raises(InvalidInput, match="takes no scaling or basis"):
            rel.open_session(terms, disclosure)
    assert ledger.store.entries("d") == []
