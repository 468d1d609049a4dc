"""A job over several sources: each source charges its own session on its own ledger, a source
that refuses leaves the job with the others (and is named), and nothing is charged twice."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from dpda.data.synthetic import two_domains
from dpda.dp.ledger import Budget
from dpda.errors import ConfigError, DpdaError, PolicyRefused, SourceDropped
from dpda.protocol import TargetDisclosure
from dpda.simulation import simulate_consortium
from dpda.target_party.consortium import Consortium
from dpda.target_party.view import AdaptConfig, target_view
from dpda.terms import SessionTerms
from tests.support import memory_releaser

TERMS = SessionTerms(
    dataset="synthetic", epsilon=4.0, delta=1e-4, projection_dim=10, preprocessing="none"
)


def _sources(n: int = 3) -> dict:
    out = {}
    for k in range(n):
        src, _ = two_domains(300, 200, k=12, seed=k)
        out[f"s{k}"] = memory_releaser(
            src, "synthetic", Budget(8.0, 1e-4), np.random.default_rng(k)
        )
    return out


def _consortium(parts: dict) -> Consortium:
    """The sources of ``_sources`` as one consortium, each read by its own ledger."""
    return Consortium(
        {n: r for n, (r, _) in parts.items()},
        {n: partial(led.spent, "synthetic") for n, (_, led) in parts.items()},
    )


def test_each_source_charges_its_own_session_once_and_the_batches_are_theirs() -> None:
    parts = _sources()
    con = _consortium(parts)
    info = con.open_session(TERMS, TargetDisclosure(None, None))
    assert info.plan.steps == sum(s.plan.steps for s in con.sessions.values()) == 3
    for i in range(info.plan.steps):
        rel = con.release(info.session_id, i)
        assert rel.index == i and con.source_of(i) == f"s{i}"
    con.close_session(info.session_id)
    spent = con.spent_by_source()
    assert set(spent) == {"s0", "s1", "s2"}
    for name, (_, led) in parts.items():
        assert 0.99 * TERMS.epsilon <= spent[name] <= TERMS.epsilon
        assert len(led.store.entries("synthetic")) == 1  # one charge each, none twice
    assert con.spent() == max(spent.values())


def test_a_source_that_refuses_leaves_the_job_with_the_others_and_is_named() -> None:
    parts = _sources()

    class Refusing:
        def open_session(self, *a, **kw):
            raise PolicyRefused("over its cap")

    sources = {n: r for n, (r, _) in parts.items()}
    sources["s1"] = Refusing()  # type: ignore[assignment]
    con = Consortium(sources, {n: partial(led.spent, "synthetic") for n, (_, led) in parts.items()})
    info = con.open_session(TERMS, TargetDisclosure(None, None))
    assert set(con.sessions) == {"s0", "s2"} and "over its cap" in con.missing["s1"]
    assert info.plan.steps == 2 and {con.source_of(i) for i in range(2)} == {"s0", "s2"}
    assert con.spent_by_source()["s1"] == 0.0  # nothing charged at the refusing source


def test_terms_a_consortium_does_not_combine_are_refused_before_anything_opens() -> None:
    parts = _sources(2)
    con = _consortium(parts)
    with pytest.raises(ConfigError, match="own space"):
        con.open_session(
            TERMS.model_copy(update={"projection": "target-pca"}), TargetDisclosure(None, None)
        )
    assert all(led.store.entries("synthetic") == [] for _, led in parts.values())
    with pytest.raises(ConfigError, match="two sources"):
        Consortium({"s0": parts["s0"][0]}, {})


@pytest.mark.slow
def test_the_rehearsal_reports_each_sources_spend_and_pools_the_references() -> None:
    from dpda.target_party.choice import voters

    domains = {f"s{k}": two_domains(300, 200, k=12, seed=k)[0] for k in range(3)}
    _, target = two_domains(300, 200, k=12, seed=9)
    out = simulate_consortium(domains, target, TERMS, "raw", AdaptConfig(), seed=0)
    data = out.to_json(TERMS)
    assert set(data["epsilon_spent_by_source"]) == set(domains)
    assert data["epsilon_spent"] == max(data["epsilon_spent_by_source"].values()) <= 4.0
    assert data["accuracy"]["kept"] is not None and data["accuracy"]["dp_no_adaptation"] is not None
    assert data["references"]["pooled"] == list(domains)
    assert all(len(entries) == 1 for entries in out.ledgers.values())
    ch = data["choice"]  # several sources: the pooled release's arms may vote too
    assert ch["pooled_vote"] is True
    arms = ch["arms"]
    pooled = {arms[i]["arm"] for i in voters(arms, pooled=True)}
    assert set(ch["vote"]["members"]) == pooled
    # the sources' class images averaged class by class are adapted arms of every space,
    # at the job's transport step and at the full image
    spaces = {(a["scaling"], a["dim"]) for a in arms}
    for what in ("dpda_pooled_step", "dpda_pooled_full"):
        got = [a for a in arms if a["arm"].startswith(what + "/")]
        assert got and all(a["adapt"] for a in got)
        assert {(a["scaling"], a["dim"]) for a in got} == spaces


def test_the_pooled_images_average_each_classs_images_by_the_sources_counts() -> None:
    from types import SimpleNamespace

    from dpda.target_party.choice import _pooled_images

    basis = np.eye(4)[:, :2]  # the OT space: the view's first two columns
    x = np.array([[0.0, 0.0, 0, 0], [1.0, 0.0, 0, 0], [0.0, 3.0, 0, 0], [1.0, 3.0, 0, 0]])
    cfg = AdaptConfig(transport_step=0.5, refine=0.0)
    s = SimpleNamespace(
        cfg=cfg,
        space=SimpleNamespace(basis=basis),
        xt_proj=x @ basis,
        view=SimpleNamespace(x=x, known=np.full(4, -1)),
    )
    points = np.array([[0.0, 0.0], [1.0, 0.0]])  # each source's two class points (OT space)

    def fit(image_y: float, weight: float) -> SimpleNamespace:
        image = np.array([[0.0, image_y, 0, 0], [1.0, image_y, 0, 0]])
        mapped = 0.5 * points @ basis.T + 0.5 * image  # what the job's step makes of them
        return SimpleNamespace(
            mapped=mapped, points=points, labels=np.array([0, 1]), weights=np.full(2, weight)
        )

    fits = [fit(4.0, 1.0), fit(2.0, 3.0)]  # images at height 4 and 2, counts 1 : 3
    for full, height in ((True, 2.5), (False, 1.25)):
        model, pred = _pooled_images(s, fits, full)  # type: ignore[arg-type]
        for c, at in enumerate(([0.0, height, 0, 0], [1.0, height, 0, 0])):
            dist, _ = model.kneighbors(np.array([at]), 1)  # type: ignore[attr-defined]
            assert dist[0, 0] == pytest.approx(0.0, abs=1e-12)
            assert model.predict(np.array([at]))[0] == c  # type: ignore[attr-defined]
        assert pred.tolist() == [0, 1, 0, 1]


def test_the_pooled_vote_counts_the_arms_without_adaptation_near_the_counts() -> None:
    from dpda.target_party.choice import voters

    def arm(name: str, adapt: bool, counts: float, collapsed: bool = False) -> dict:
        return {"arm": name, "adapt": adapt, "collapsed": collapsed, "scores": {"counts": counts}}

    arms = [arm("a", True, 0.9), arm("b", True, 0.5), arm("p", False, 0.95),
            arm("q", False, 0.99, collapsed=True), arm("r", False, 0.6)]  # fmt: skip
    assert voters(arms) == [0]  # one source: the adapted arms near the counts
    assert voters(arms, pooled=True) == [0, 2]  # several: the pooled release's near arm too
    far = [arm("a", True, 0.5), arm("p", False, 0.6)]
    assert voters(far) == [0] and voters(far, pooled=True) == [0, 1]  # none near: every one


def test_the_pooled_vote_weighs_each_voter_by_its_spaces_dimension_and_one_source_does_not() -> (
    None
):
    from dpda.target_party.choice import PER_ROW_VOTE, STANDARDIZED_VOTE, vote_weights

    def arm(dim: int, counts: float) -> dict:
        return {"dim": dim, "scores": {"counts": counts, "silhouette": 0.2}}

    rows = [arm(10, 1.0), arm(20, 1.0), arm(50, 0.9), arm(1, 1.0)]
    plain = vote_weights(rows, [0, 1, 2, 3])
    t = PER_ROW_VOTE.temperature
    assert plain == pytest.approx([1.0, 1.0, np.exp(-0.1 / t), 1.0])  # one source: the counts
    several = vote_weights(rows, [0, 1, 2, 3], pooled=True)
    room = np.log1p([10, 20, 50, 1]) / np.log1p(50)  # the largest space among the voters: 1
    assert several == pytest.approx(np.array(plain) * room)
    assert several[3] > 0  # a one-dimensional space still votes
    # the factor is relative to the voters' largest space, and composes with the cut factor
    assert vote_weights(rows, [0, 1], pooled=True) == pytest.approx(
        [np.log1p(10) / np.log1p(20), 1]
    )
    cut = vote_weights(rows, [0, 2], STANDARDIZED_VOTE)
    both = vote_weights(rows, [0, 2], STANDARDIZED_VOTE, pooled=True)
    assert both == pytest.approx(np.array(cut) * np.log1p([10, 50]) / np.log1p(50))


def test_only_a_job_holding_several_sources_lets_the_pooled_release_vote() -> None:
    from dpda.target_party.consortium import pooled_job

    parts = _sources()
    con = _consortium(parts)
    info = con.open_session(TERMS, TargetDisclosure(None, None))
    con.release(info.session_id, 0)  # one source's release so far: a plain job
    assert con.in_job() == ["s0"] and not pooled_job(con) and not pooled_job(parts["s0"][0])
    con.release(info.session_id, 1)
    con.missing["s1"] = "dropped after its release"  # what it delivered stays in the job
    assert con.in_job() == ["s0", "s1"] and pooled_job(con)


@pytest.mark.parametrize(
    "argv",
    [
        ["--source", "A", "--source", "A", "--target", "W"],
        ["--source", "A", "--source", "W", "--target", "W"],
    ],
)
def test_the_cli_refuses_a_source_twice_or_the_target_as_a_source_naming_the_flag(
    argv: list[str], tmp_path, capsys
) -> None:
    from dpda.cli.main import main

    out = tmp_path / "out.json"
    rc = main(["simulate", "--dataset", "office-caltech", *argv, "--json", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert "--source" in err and "Traceback" not in err
    assert not out.exists()  # nothing ran, nothing written


class _DiesAtRelease:
    """A source that opens its session, charges and draws its release, then dies before the
    release reaches the target (a daemon killed mid-job, as the target's client sees it:
    unreachable)."""

    def __init__(self, inner) -> None:
        self.inner, self.asked = inner, 0

    def open_session(self, *a, **kw):
        return self.inner.open_session(*a, **kw)

    def release(self, *a, **kw):
        self.asked += 1
        self.inner.release(*a, **kw)  # charged at the source, then lost with the daemon
        raise DpdaError("source unreachable: the daemon stopped answering")

    def close_session(self, *a, **kw):
        raise DpdaError("source unreachable: the daemon stopped answering")


@pytest.mark.slow
def test_a_source_that_fails_mid_job_is_dropped_and_the_job_ends_on_the_others() -> None:
    from dpda.target_party.pipeline import run_dpda

    parts = _sources()
    dying = _DiesAtRelease(parts["s1"][0])
    sources = {n: r for n, (r, _) in parts.items()}
    sources["s1"] = dying  # type: ignore[assignment]
    con = Consortium(sources, {n: partial(led.spent, "synthetic") for n, (_, led) in parts.items()})
    _, target = two_domains(300, 200, k=12, seed=9)
    view = target_view(target, "raw", scaling_mode="zscore", terms=TERMS)
    out = run_dpda(con, view, TERMS, AdaptConfig(seed=0), con.spent)
    assert out.accuracy is not None and out.n_batches == 3
    assert dying.asked == 1  # asked once, never again
    assert set(con.missing) == {"s1"} and "unreachable" in con.missing["s1"]
    assert con.report()["opened"] == ["s0", "s1", "s2"] and "s1" in con.report()["missing"]
    for _, led in parts.values():
        # each source charged once, the dropped one too (its release was charged at the
        # source before the target lost it): nothing twice, nothing at another's ledger
        assert len(led.store.entries("synthetic")) == 1
    assert con.spent_by_source()["s1"] <= TERMS.epsilon


@pytest.mark.slow
def test_a_job_whose_every_source_fails_mid_job_says_so() -> None:
    from dpda.target_party.pipeline import run_dpda

    parts = _sources(2)
    sources = {n: _DiesAtRelease(r) for n, (r, _) in parts.items()}
    con = Consortium(sources, {n: partial(led.spent, "synthetic") for n, (_, led) in parts.items()})
    _, target = two_domains(300, 200, k=12, seed=9)
    with pytest.raises(SourceDropped, match="every source left the job"):
        run_dpda(
            con,
            target_view(target, "raw", scaling_mode="zscore", terms=TERMS),
            TERMS,
            AdaptConfig(),
            con.spent,
        )
    assert set(con.missing) == {"s0", "s1"}


@pytest.mark.parametrize("step", [0.0, 1e-300, 1e-7, 1.0])
def test_a_transport_step_the_full_image_cannot_be_solved_from_leaves_only_the_step_arm(
    step: float,
) -> None:
    domains = {f"s{k}": two_domains(120, 80, k=6, seed=k)[0] for k in range(2)}
    _, target = two_domains(120, 80, k=6, seed=9)
    terms = TERMS.model_copy(update={"projection_dim": 4})
    cfg = AdaptConfig(transport_step=step)
    out = simulate_consortium(domains, target, terms, "raw", cfg, seed=0).to_json(terms)
    names = [a["arm"] for a in out["choice"]["arms"]]
    assert any(n.startswith("dpda_pooled_step/") for n in names)
    assert not any(n.startswith("dpda_pooled_full/") for n in names)
    assert 0.0 <= out["accuracy"]["kept"] <= 100.0  # finite labels: no image blown up by 1/step
