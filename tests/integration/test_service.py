"""The two parties over real gRPC + mTLS on port 0, with SQLite ledgers on both sides."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dpda.data.preprocessing import Scaling
from dpda.data.synthetic import two_domains
from dpda.deployment import set_source_address
from dpda.dp.ledger import LedgerEntry
from dpda.errors import BudgetExceeded, InvalidInput, PeerMisbehaved
from dpda.protocol import TargetDisclosure
from dpda.service.config import load_source, load_target
from dpda.simulation import simulate
from dpda.source_party.app import run_server
from dpda.source_party.handlers import SignedRelease
from dpda.source_party.rpc_batches import Batches
from dpda.source_party.rpc_sessions import Sessions
from dpda.target_party.app import open_state, run
from dpda.target_party.view import AdaptConfig
from dpda.terms import SessionTerms

from .helpers import DELTA, handlers_with, synthetic_deployment


def _run_target(dep, port):
    set_source_address(dep, f"127.0.0.1:{port}")
    return run(load_target(dep.target_config), progress=False)


def test_job_completes_and_both_ledgers_are_identical(tmp_path) -> None:
    dep = synthetic_deployment(tmp_path, job={"batch_size": 120, "steps": 5}, attribute_unit=True)
    with run_server(load_source(dep.source_config)) as rs:
        out = _run_target(dep, rs.port)
        source_entries = rs.handlers.ledger.store.entries("synthetic")
    target_ledger, _ = open_state(load_target(dep.target_config))
    target_entries = target_ledger.store.entries("synthetic")
    assert len(source_entries) == 5
    assert [e.to_json() for e in source_entries] == [e.to_json() for e in target_entries]
    assert all(e.source_sig and e.target_sig for e in target_entries)
    assert out["epsilon_spent"] == pytest.approx(source_entries[-1].spend_after)
    assert out["batches"] == 5 and out["accuracy"] > 50


def test_source_refuses_over_cap_even_when_target_check_is_bypassed(tmp_path) -> None:
    # the target believes it has budget 100; the source's per-peer cap is 2
    dep = synthetic_deployment(tmp_path, peer_cap=2.0, target_budget=100.0)
    with run_server(load_source(dep.source_config)) as rs:
        with pytest.raises(BudgetExceeded, match="source refused"):
            _run_target(dep, rs.port)
        assert rs.handlers.ledger.store.entries("synthetic") == []
    target_ledger, _ = open_state(load_target(dep.target_config))
    assert target_ledger.store.entries("synthetic") == []


def test_target_does_not_ask_beyond_its_own_budget(tmp_path) -> None:
    dep = synthetic_deployment(tmp_path, target_budget=1.0)
    with run_server(load_source(dep.source_config)) as rs:
        with pytest.raises(BudgetExceeded):
            _run_target(dep, rs.port)
        # no release was even requested: the audit log holds no ReleaseBatches record
        methods = {r.method.rsplit("/", 1)[-1] for r, _ in rs.audit.records()}
        assert "ReleaseBatches" not in methods
        assert rs.handlers.ledger.store.entries("synthetic") == []


def _first_gaussian(ev: dict) -> dict:
    if "noise_multiplier" in ev:
        return ev
    if ev["type"] == "LabelBranchDpEvent":
        return _first_gaussian(ev["same_label"])
    return _first_gaussian(ev["events"][0] if "events" in ev else ev["event"])


class _Tamper(Batches):
    mode = ""

    def release_one(self, peer, releaser, session_id, index, call) -> SignedRelease:
        sr = super().release_one(peer, releaser, session_id, index, call)
        rel, entry = sr.release, sr.entry
        if self.mode == "payload":
            z = rel.z.copy()
            z[0, 0] += 1.0
            return SignedRelease(dataclasses.replace(rel, z=z), entry)
        if self.mode == "signature":
            return SignedRelease(rel, dataclasses.replace(entry, source_sig="A" * 86 + "=="))
        if self.mode == "charge":
            d = json.loads(entry.to_json())
            # the joint event of the default prototypes, or a composition (the preprocessing's
            # with the first release's): its first Gaussian claims more noise than drawn
            _first_gaussian(d["dp_event"])["noise_multiplier"] *= 2
            forged = LedgerEntry(**d)
            from dpda.service import signing

            sig = signing.sign(self.ctx.desk.key, forged.signed_message())
            return SignedRelease(rel, dataclasses.replace(forged, source_sig=sig))
        if self.mode == "short":
            # one (class, cell) fewer than the terms make (q × cells sums and counts), under a
            # digest and signature that match it: the size lies, the target's shape check says so
            forged_rel = dataclasses.replace(rel, z=rel.z[:-1], noisy_counts=rel.noisy_counts[:-1])
            forged = dataclasses.replace(entry, payload_sha256=forged_rel.sha256(), source_sig="")
            from dpda.service import signing

            sig = signing.sign(self.ctx.desk.key, forged.signed_message())
            return SignedRelease(forged_rel, dataclasses.replace(forged, source_sig=sig))
        if self.mode in ("statistics", "no-statistics"):
            # a hostile standardization (a scale ≤ 0), or none, under a digest and signature
            # that match it: the target's own checks refuse it
            assert rel.standardization is not None
            loc, scale, c = rel.standardization
            bad = (loc, -scale, c) if self.mode == "statistics" else None
            forged_rel = dataclasses.replace(rel, standardization=bad)
            forged = dataclasses.replace(entry, payload_sha256=forged_rel.sha256(), source_sig="")
            from dpda.service import signing

            sig = signing.sign(self.ctx.desk.key, forged.signed_message())
            return SignedRelease(forged_rel, dataclasses.replace(forged, source_sig=sig))
        return sr


@pytest.mark.parametrize(
    "mode", ["payload", "signature", "charge", "statistics", "no-statistics", "short"]
)
def test_target_detects_a_misbehaving_source(tmp_path, mode: str) -> None:
    dep = synthetic_deployment(tmp_path)
    cls = handlers_with(batches=type(f"Tamper_{mode}", (_Tamper,), {"mode": mode}))
    why = {
        "statistics": "not finite and positive",
        "no-statistics": "lacks the source's",
        "short": "noisy_counts is not the <i8 array of shape",
    }
    with run_server(load_source(dep.source_config), cls) as rs:
        with pytest.raises(PeerMisbehaved, match=why.get(mode)):
            _run_target(dep, rs.port)
    target_ledger, _ = open_state(load_target(dep.target_config))
    assert target_ledger.store.entries("synthetic") == []  # nothing accepted


class _OtherBasis(Sessions):
    """Plans and releases with an orthonormal basis of its own instead of the target's."""

    def plan(self, releaser, terms, disclosure, projection=None):
        if disclosure.basis is not None and projection is None:
            rng = np.random.default_rng(0)
            q, _ = np.linalg.qr(rng.normal(size=np.asarray(disclosure.basis).shape))
            disclosure = TargetDisclosure(disclosure.scaling, q)
        return super().plan(releaser, terms, disclosure, projection)


def test_target_detects_a_source_using_another_projection(tmp_path) -> None:
    """The target does not ask its own basis back (no GetProjection round trip under
    target-pca): every release's signed ledger entry binds the digest of the projection it was
    computed with, and one that is not the target's basis is refused, nothing accepted."""
    dep = synthetic_deployment(tmp_path, job={"projection": "target-pca"})
    with run_server(load_source(dep.source_config), handlers_with(sessions=_OtherBasis)) as rs:
        with pytest.raises(PeerMisbehaved, match="computed with another projection"):
            _run_target(dep, rs.port)
        methods = {r.method.rsplit("/", 1)[-1] for r, _ in rs.audit.records()}
        assert "GetProjection" not in methods and "ReleaseBatches" in methods
    target_ledger, _ = open_state(load_target(dep.target_config))
    assert target_ledger.store.entries("synthetic") == []


class _OtherScaling(Sessions):
    """Releases with a column mean of its own instead of the target's (the plan, which reads
    only the std, is unchanged)."""

    def plan(self, releaser, terms, disclosure, projection=None):
        if disclosure.scaling is not None:
            sc = disclosure.scaling
            disclosure = TargetDisclosure(Scaling(sc.mean + 1.0, sc.std), disclosure.basis)
        return super().plan(releaser, terms, disclosure, projection)


def test_target_detects_a_source_using_another_scaling(tmp_path) -> None:
    """Every release's signed entry binds the digests of the scaling its features were
    computed with; one that is not the scaling the target sent is refused, nothing accepted."""
    dep = synthetic_deployment(tmp_path, job={"projection": "target-pca"})
    with run_server(load_source(dep.source_config), handlers_with(sessions=_OtherScaling)) as rs:
        with pytest.raises(PeerMisbehaved, match="computed with another scaling"):
            _run_target(dep, rs.port)
    target_ledger, _ = open_state(load_target(dep.target_config))
    assert target_ledger.store.entries("synthetic") == []


class _FailOnce(Batches):
    """Refuses the session's release ``index`` once (the job stops with its session saved)."""

    index = 1
    failed = False

    def release_one(self, peer, releaser, session_id, index, call) -> SignedRelease:
        if index == self.index and not type(self).failed:
            type(self).failed = True
            raise InvalidInput("not now", public=True)
        return super().release_one(peer, releaser, session_id, index, call)


@pytest.mark.parametrize("stop_at", [0, 1])
def test_a_resumed_session_with_another_scaling_is_refused_before_anything_is_asked(
    tmp_path, stop_at: int
) -> None:
    """A job that stopped (before its first release, or after it) resumes its session on the
    rerun. If the target's scaling changed in between (here the scaling mode; the data changing
    does the same), the source would still release under the session's old scaling: the
    rerun says so, naming job.json, before it asks anything (job.json records the scaling's
    digests; the session's release entries bind them too)."""
    job = {"batch_size": 120, "steps": 3, "projection": "jl"}  # a JL basis is kept on resume
    dep = synthetic_deployment(tmp_path, job=job, attribute_unit=True)
    fail_at = type("FailAt", (_FailOnce,), {"index": stop_at, "failed": False})
    handlers = handlers_with(batches=fail_at)
    with run_server(load_source(dep.source_config), handlers) as rs:
        set_source_address(dep, f"127.0.0.1:{rs.port}")
        with pytest.raises(InvalidInput, match="not now"):
            run(load_target(dep.target_config), progress=False)
        assert len(rs.handlers.ledger.store.entries("synthetic")) == stop_at
        cfg = load_target(dep.target_config)
        assert (cfg.state_dir / "job.json").is_file()
        asked = len(rs.audit.records())
        other = cfg.model_copy(update={"job": cfg.job.with_changes(scaling="uniform")})
        with pytest.raises(InvalidInput, match="opened with another scaling"):
            run(other, progress=False)
        assert len(rs.handlers.ledger.store.entries("synthetic")) == stop_at  # nothing charged
        opened = [r for r, _ in rs.audit.records()[asked:] if r.method.endswith("OpenSession")]
        assert opened == []  # refused before the session was even asked for
        # the same scaling as before resumes the session and finishes it
        out = run(load_target(dep.target_config), progress=False)
        assert out["batches"] == 3
        assert len(rs.handlers.ledger.store.entries("synthetic")) == 3


def test_service_equals_simulate_for_a_fixed_seed(tmp_path) -> None:
    dep = synthetic_deployment(
        tmp_path, seed=123, job={"batch_size": 150, "steps": 3}, attribute_unit=True
    )
    with run_server(load_source(dep.source_config)) as rs:
        out = _run_target(dep, rs.port)
    src, tgt = two_domains()
    terms = SessionTerms(
        dataset="synthetic",
        epsilon=4.0,
        delta=DELTA,
        projection_dim=10,
        batch_size=150,
        steps=3,
        noise_multiplier=0.0,
        privacy_unit="attribute",
    )
    sim = simulate(src, tgt, terms, "raw", AdaptConfig(), seed=123, baselines=False)
    assert out["accuracy"] == sim.dpda.accuracy
    assert out["w_tilde"] == sim.dpda.w_tilde
    assert out["epsilon_spent"] == pytest.approx(sim.dpda.epsilon_spent, abs=1e-12)
    import hashlib

    assert out["predictions_sha256"] == hashlib.sha256(sim.dpda.predictions.tobytes()).hexdigest()
    assert np.isfinite(out["w_tilde"])


def test_the_default_job_under_the_targets_default_policy_equals_its_rehearsal(tmp_path) -> None:
    """The rehearsal is the job: the default terms (prototypes in the source's own space) and
    the target's default ``[privacy]`` (DP disclosures) over the two daemons give the
    predictions, the source's ε and the target's ε (0: nothing of its rows is sent) that
    ``simulate`` gives in-process for the same data and seed."""
    import hashlib

    dep = synthetic_deployment(tmp_path, seed=31, target_privacy={})
    with run_server(load_source(dep.source_config)) as rs:
        out = _run_target(dep, rs.port)
        opened = [r for r, _ in rs.audit.records() if r.method.endswith("OpenSession")]
    assert out["projection"] == "source" and out["release"] == "prototypes"
    assert out["target_epsilon_spent"] == 0.0 and out["target_disclosures"] == "none"
    assert opened  # a session was opened, with no scaling or basis in it (the source refuses)
    src, tgt = two_domains()
    terms = SessionTerms(dataset="synthetic", epsilon=4.0, delta=DELTA, projection_dim=10)
    sim = simulate(src, tgt, terms, "raw", AdaptConfig(), seed=31, baselines=False,
                   scaling_mode="uniform")  # fmt: skip
    assert out["predictions_sha256"] == hashlib.sha256(sim.dpda.predictions.tobytes()).hexdigest()
    assert out["epsilon_spent"] == pytest.approx(sim.dpda.epsilon_spent, abs=1e-12)
    assert sim.to_json(terms)["target_epsilon_spent"] == 0.0
    assert out["adaptation"]["kept"] == sim.dpda.adaptation["kept"]


@pytest.mark.parametrize("method", ["pate", "dpda+pate"])
def test_pate_channels_over_the_service_equal_simulate(tmp_path, method: str) -> None:
    dep = synthetic_deployment(
        tmp_path, seed=9, job={"method": method, "pate_queries": 40, "pate_teachers": 20}
    )
    with run_server(load_source(dep.source_config)) as rs:
        out = _run_target(dep, rs.port)
        kinds = [e.params.get("kind", "batch") for e in rs.handlers.ledger.store.entries()]
    assert ("pate" in kinds) and (("batch" in kinds) == (method == "dpda+pate"))
    src, tgt = two_domains()
    terms = SessionTerms(
        dataset="synthetic", epsilon=4.0, delta=DELTA, projection_dim=10, pate_teachers=20
    )
    sim = simulate(
        src,
        tgt,
        terms,
        "raw",
        AdaptConfig(),
        seed=9,
        baselines=False,
        methods=(method,),
        pate_queries=40,
    )
    assert out["accuracy"] == sim.runs[method].accuracy
    assert out["epsilon_spent"] == pytest.approx(sim.runs[method].epsilon_spent, abs=1e-12)
    assert out["epsilon_spent"] <= 4.0
    key = method.replace("+", "_")
    assert out["accuracy_by_method"][key] == out["accuracy"]


def test_target_resyncs_when_another_session_released_meanwhile(tmp_path) -> None:
    from dpda.data.synthetic import two_domains
    from dpda.target_party.client import GrpcReleaseSource
    from dpda.target_party.view import target_view

    dep = synthetic_deployment(tmp_path, job={"batch_size": 100, "steps": 2}, attribute_unit=True)
    with run_server(load_source(dep.source_config)) as rs:
        set_source_address(dep, f"127.0.0.1:{rs.port}")
        base = load_target(dep.target_config)
        clients = []
        for name in ("a", "b"):
            cfg = base.model_copy(update={"state_dir": tmp_path / f"target-{name}"})
            ledger, audit = open_state(cfg)
            clients.append((GrpcReleaseSource(cfg, ledger, audit), ledger))
        view = target_view(two_domains()[1], "raw")
        from dpda.protocol import TargetDisclosure

        terms = SessionTerms(
            dataset="synthetic",
            epsilon=4.0,
            delta=DELTA,
            projection="jl",
            projection_dim=10,
            batch_size=100,
            steps=2,
            noise_multiplier=0.0,
            privacy_unit="attribute",
        )
        (ca, la), (cb, lb) = clients
        sa = ca.open_session(terms, TargetDisclosure(view.scaling, None))
        sb = cb.open_session(terms, TargetDisclosure(view.scaling, None))
        cb.release(sb.session_id, 0)  # the source's head moves past what client a has seen
        cb.settle()  # b's countersignature is in: the source may charge this peer again
        ca.release(sa.session_id, 0)  # a is told the heads differ, syncs, verifies, retries
        ca.settle()  # its charge check and countersignature finish in the background
        # the entry a lacked came with its release (catch_up): no refusal, no extra round trip
        refused = rs.metrics.registry.get_sample_value(
            "dpda_refusals_total", {"code": "LEDGER_BEHIND"}
        )
        assert not refused
        source_rows = [e.to_json() for e in rs.handlers.ledger.store.entries("synthetic")]
        assert len(source_rows) == 2
        assert [e.to_json() for e in la.store.entries("synthetic")] == source_rows
        for c, _ in clients:
            c.close()


@pytest.mark.parametrize(
    ("lost", "via"),
    [
        (("payload_sha256", "source_sig", "target_sig"), "sync"),
        (("source_sig",), "sync"),
        (("target_sig",), "sync"),
        (("payload_sha256", "source_sig", "target_sig"), "countersign"),
        (("source_sig",), "countersign"),
        (("target_sig",), "countersign"),
    ],
)
def test_a_source_that_lost_an_entrys_signatures_gets_them_back(tmp_path, lost, via) -> None:
    """Lost writes on the source after a charge: it holds the last entry without its payload
    hash and signatures while the target holds it doubly signed. The target's next contact
    (a sync) sends its copy back; the source verifies both signatures and completes its entry,
    so the two ledgers are equal again and that release can never be drawn a second time."""
    import sqlite3

    from dpda.target_party.client import GrpcReleaseSource

    dep = synthetic_deployment(tmp_path, job={"batch_size": 120, "steps": 3}, attribute_unit=True)
    with run_server(load_source(dep.source_config)) as rs:
        _run_target(dep, rs.port)
        store = rs.handlers.ledger.store
        last = store.entries("synthetic")[-1]
        stripped = dataclasses.replace(last, **dict.fromkeys(lost, ""))
        with sqlite3.connect(dep.source_state / "state.sqlite") as conn:
            conn.execute(
                "UPDATE ledger SET entry_json=? WHERE dataset=? AND seq=?",
                (stripped.to_json(), "synthetic", last.seq),
            )
        assert store.entries("synthetic")[-1] == stripped
        cfg = load_target(dep.target_config)
        ledger, audit = open_state(cfg)
        client = GrpcReleaseSource(cfg, ledger, audit)
        try:
            if via == "sync":
                client.sync_ledger()
            else:  # the target's countersignature arrives at the source that lost the writes
                client.ledger_sync.countersign(ledger.store.entries("synthetic")[-1])
        finally:
            client.close()
        assert store.entries("synthetic")[-1] == last
        assert [e.to_json() for e in store.entries("synthetic")] == [
            e.to_json() for e in ledger.store.entries("synthetic")
        ]


def test_the_target_checks_the_public_facts_before_it_asks_for_anything(tmp_path) -> None:
    """A δ other than the dataset's, or another feature count, is a clear local error naming
    the field — before any session is opened or anything charged."""
    from dpda.errors import ConfigError

    dep = synthetic_deployment(tmp_path)
    text = dep.target_config.read_text().replace(f"delta = {DELTA!r}", "delta = 0.0001")
    dep.target_config.write_text(text)
    with run_server(load_source(dep.source_config)) as rs:
        with pytest.raises(ConfigError, match=r"job.delta: 0.0001, but the source's dataset"):
            _run_target(dep, rs.port)
        assert rs.handlers.ledger.store.entries("synthetic") == []
        (n,) = rs.handlers.conn.execute("SELECT COUNT(*) FROM sessions").fetchone()
        assert n == 0


def test_plan_says_when_a_job_does_not_fit_and_spends_nothing(tmp_path) -> None:
    from dpda.target_party.planning import plan_job

    dep = synthetic_deployment(tmp_path, epsilon=4.0, peer_cap=2.0, target_budget=100.0)
    with run_server(load_source(dep.source_config)) as rs:
        set_source_address(dep, f"127.0.0.1:{rs.port}")
        out = plan_job(load_target(dep.target_config))
        assert not out["fits"]  # this peer's cap at the source is 2, the job charges more
        assert out["epsilon_remaining_by_cap"]["source_peer"] == 2.0
        assert out["epsilon_remaining"] == 2.0 < out["epsilon_charge"] <= 4.0
        assert out["resources"]["peak_memory_mb"] > out["resources"]["by_part"]["one_fit_mb"]
        assert out["resources"]["seconds"] > 0 and "estimate" in out["resources"]["how"]
        assert rs.handlers.ledger.store.entries("synthetic") == []


@pytest.mark.parametrize(
    "lie",
    [
        {"n_rows": 0},
        {"delta": float("nan")},
        {"delta": 1e308},
        {"peer_epsilon_cap": float("inf")},
        {"dataset_epsilon_spent": -1e-300},
        {"epsilon_remaining": float("nan")},
    ],
)
def test_a_source_lying_in_its_description_is_refused_before_anything(tmp_path, lie) -> None:
    class Lying(Sessions):
        def describe(self, peer: str, dataset: str, planned_terms_json: str = "") -> dict:
            return {**super().describe(peer, dataset, planned_terms_json), **lie}

    dep = synthetic_deployment(tmp_path)
    with run_server(load_source(dep.source_config), handlers_with(sessions=Lying)) as rs:
        with pytest.raises(PeerMisbehaved, match="description of its dataset is out of range"):
            _run_target(dep, rs.port)
        assert rs.handlers.ledger.store.entries("synthetic") == []


def test_sinkhorn_synthetic_over_the_service_equals_simulate(tmp_path) -> None:
    """The DP-Sinkhorn release through the real daemons (mTLS, SQLite ledgers on both sides):
    the target verifies the point count against the noisy counts and recomputes the T-step
    charge; the numbers equal the in-process run with the same seed."""
    job = {
        "release": "sinkhorn-synthetic",
        "synthetic_points": 2,
        "synthetic_rows_per_point": 1,
        "sinkhorn_steps": 4,
    }
    dep = synthetic_deployment(tmp_path, seed=77, job=job)
    with run_server(load_source(dep.source_config)) as rs:
        out = _run_target(dep, rs.port)
        source_entries = rs.handlers.ledger.store.entries("synthetic")
    target_ledger, _ = open_state(load_target(dep.target_config))
    target_entries = target_ledger.store.entries("synthetic")
    assert [e.to_json() for e in source_entries] == [e.to_json() for e in target_entries]
    assert len(source_entries) == 1 and source_entries[0].params["spec"]["features"]["steps"] == 4
    src, tgt = two_domains()
    terms = SessionTerms(dataset="synthetic", epsilon=4.0, delta=DELTA, projection_dim=10, **job)
    sim = simulate(src, tgt, terms, "raw", AdaptConfig(), seed=77, baselines=False)
    assert out["accuracy"] == sim.dpda.accuracy
    assert out["epsilon_spent"] == pytest.approx(sim.dpda.epsilon_spent, abs=1e-12)
    assert out["epsilon_spent"] <= 4.0
    assert out["rows_received"] == 2 * len(set(tgt.y.tolist()))


def test_metric_cost_over_the_service_equals_simulate(tmp_path) -> None:
    """cost = metric through the real daemons: W travels as one more signed release of the
    session, the target recomputes its charge and the ledgers agree; the numbers equal the
    in-process run with the same seed, and ε spent includes the metric's charge."""
    job = {"cost": "metric", "metric_dim": 4, "metric_steps": 5}
    dep = synthetic_deployment(tmp_path, seed=78, job=job, metric=True)
    with run_server(load_source(dep.source_config)) as rs:
        out = _run_target(dep, rs.port)
        source_entries = rs.handlers.ledger.store.entries("synthetic")
    target_ledger, _ = open_state(load_target(dep.target_config))
    target_entries = target_ledger.store.entries("synthetic")
    assert [e.to_json() for e in source_entries] == [e.to_json() for e in target_entries]
    kinds = [e.params["spec"].get("kind") for e in source_entries]
    assert kinds == ["metric", None]  # the metric first, then the session's feature release
    assert all(e.source_sig and e.target_sig and e.payload_sha256 for e in source_entries)
    src, tgt = two_domains()
    terms = SessionTerms(dataset="synthetic", epsilon=4.0, delta=DELTA, projection_dim=10, **job)
    sim = simulate(src, tgt, terms, "raw", AdaptConfig(), seed=78, baselines=False)
    assert out["accuracy"] == sim.dpda.accuracy
    assert out["epsilon_spent"] == pytest.approx(sim.dpda.epsilon_spent, abs=1e-12)
    assert out["epsilon_spent"] == pytest.approx(source_entries[-1].spend_after, abs=1e-12)
    assert out["epsilon_spent"] <= 4.0
    # the target's audit report lists W as its own mechanism, beside the feature release
    from dpda.service.audit import AuditLog, report
    from dpda.service.verify import open_state as verify_state

    conn, store = verify_state(str(dep.target_state))
    rep = report(AuditLog(conn, ""), {(e.dataset, e.seq): e for e in store.entries()})
    mechs = {d["mechanism"]: d["releases"] for d in rep["releases_by_dataset"].values()}
    assert mechs == {"gaussian-metric-steps": 1, "gaussian-features+counts": 1}
