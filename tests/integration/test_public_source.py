"""The reverse deployment (seed 001, issue 16) between two daemons: ``dpda source serve`` holds
the private unlabeled rows and answers the private steps under its own policy and ledger;
``dpda target run`` with ``setting = "public-source"`` holds public labeled rows and drives.
Real processes, real mTLS on port 0, real SQLite ledgers on both sides."""

from __future__ import annotations

import json
import subprocess

import grpc
import numpy as np
import pytest

from dpda.data.preprocessing import PublicSpace
from dpda.data.synthetic import two_domains
from dpda.deployment import SourceProcess, dpda_command, make_deployment, run_target
from dpda.dp import discrepancy as D
from dpda.dp import rng as noise_streams
from dpda.dp.events import event_to_json
from dpda.dp.ledger import head_hash
from dpda.pb import dpda_pb2 as pb
from dpda.pb import dpda_pb2_grpc as pb_grpc
from dpda.public_source_terms import ReweightingTerms, plan_reweighting
from dpda.service import serde, signing
from dpda.service.config import load_source, load_target
from dpda.service.tls import channel_credentials
from dpda.source_party.app import run_server
from dpda.target_party.app import open_state

DELTA = 1e-4
K = 40  # the synthetic rows' features
SEED = 7


def _deployment(tmp, *, method="noisy-fw", steps=60, epsilon=2.0, peer_cap=100.0, **job):
    dataset = {
        "name": "holder",
        "kind": "synthetic",
        "domain": "target",  # the synthetic target's 500 rows: private, here
        "epsilon": 100.0,
        "delta": DELTA,
        "policy": {"allow_reweighting": True},
    }
    base = {
        "dataset": "holder",
        "data_kind": "synthetic",  # the synthetic source's 600 labeled rows: public, there
        "setting": "public-source",
        "epsilon": epsilon,
        "delta": DELTA,
        "reweighting_method": method,
        "reweighting_steps": steps,
        "reweighting_block": 25,
        "reweighting_dim": 5,
        **job,
    }
    return make_deployment(
        tmp,
        dataset=dataset,
        job=base,
        source_extra={"seed": SEED, "insecure_testing": True},
        peer_cap=peer_cap,
    )


def _in_process(method: str, steps: int, epsilon: float) -> D.Reweighter:
    """The same optimisation in one process, with the holder's seeded noise stream."""
    src, tgt = two_domains(600, 500)
    space = PublicSpace.of(src.x, "raw", "zscore", 5)
    rows = space.map(src.x)
    y = src.y.astype(np.float64) if method == "single-stage" else None
    opt = D.Reweighter(rows, method, y=y)
    moment = D.second_moment(D.holder_rows(tgt.x, space.map, 1.0))
    radius = float(np.max(np.linalg.norm(rows, axis=1)))
    sens = D.gradient_sensitivity(D.SMOOTHING, radius, 1.0, tgt.x.shape[0])
    rng = noise_streams.testing_streams(SEED, 0)[0]
    D.run_private(opt, moment, epsilon=epsilon, delta=DELTA, steps=steps, sensitivity=sens, rng=rng)
    return opt


def _weights(path: str) -> np.ndarray:
    return np.loadtxt(path, delimiter=",", skiprows=1)[:, 1]


def test_public_source_job_between_two_daemons(tmp_path) -> None:
    dep = _deployment(tmp_path)
    source = SourceProcess(dep)
    try:
        done = run_target(dep, timeout=300)
    finally:
        source.stop()
    assert done.returncode == 0, done.stderr[-3000:]
    (results,) = (dep.target_state / "jobs").glob("*/results.json")  # the job's own folder
    out = json.loads(results.read_text())
    assert out["setting"] == "public-source" and out["method"] == "noisy-fw"
    # the holder's DP outputs, replayed by the driver, are the in-process run's exactly
    expected = _in_process("noisy-fw", 60, 2.0)
    np.testing.assert_allclose(_weights(out["weights"]), expected.weights(), atol=1e-12)
    # both ledgers: the same entries, doubly signed; ε as both sides recompute it, ≤ the terms
    holder_cfg = load_source(dep.source_config)
    with run_server(holder_cfg) as rs:  # the holder's own state, reopened
        holder = rs.handlers.ledger.store.entries("holder")
    driver, _ = open_state(load_target(dep.target_config))
    mine = driver.store.entries("holder")
    assert [e.to_json() for e in holder] == [e.to_json() for e in mine]
    assert len(mine) == 3 and all(e.source_sig and e.target_sig for e in mine)
    assert [e.params["count"] for e in mine] == [25, 25, 10]
    assert out["epsilon_job"] == pytest.approx(mine[-1].spend_after)
    assert mine[-1].spend_after <= 2.0 + 1e-9
    # the model is a pipeline on raw rows; the holder could run it on its own rows
    assert out["model"].endswith("model.skops")
    for side in (dep.source_state, dep.target_state):
        verify = subprocess.run(
            dpda_command("ledger", "verify", str(side)), capture_output=True, text=True
        )
        assert verify.returncode == 0, verify.stdout + verify.stderr


@pytest.mark.parametrize("method", ["noisy-md", "single-stage"])
def test_the_other_optimisers_over_the_service_equal_in_process(tmp_path, method) -> None:
    dep = _deployment(tmp_path, method=method, steps=30)
    with run_server(load_source(dep.source_config)) as rs:
        from dpda.target_party.app import run_public_source_job

        cfg = load_target(dep.target_config)
        cfg = cfg.model_copy(update={"source_address": f"127.0.0.1:{rs.port}"})
        out = run_public_source_job(cfg)
    expected = _in_process(method, 30, 2.0)
    np.testing.assert_allclose(_weights(out["weights"]), expected.weights(), atol=1e-9)
    if method == "single-stage":
        np.testing.assert_allclose(out["predictor"], expected.w, atol=1e-9)
    assert out["epsilon_job"] <= 2.0 + 1e-9


# --------------------------------------------------------------------- a hostile driving party
class _Peer:
    """The driving party's raw stub, signing its terms as a real one does: free to send
    anything else."""

    def __init__(self, dep, port: int) -> None:
        cfg = load_target(dep.target_config)
        creds = channel_credentials(cfg.tls.cert, cfg.tls.key, cfg.tls.peer_ca)
        self.channel = grpc.secure_channel(f"127.0.0.1:{port}", creds)
        self.stub = pb_grpc.SourceServiceStub(self.channel)
        self.key = signing.load_private(cfg.signing_key)

    def open(self, terms: ReweightingTerms, rows, *, std=None, basis=None, scale=1.0, labels=None):
        k = K
        t = terms.model_dump_json()
        req = pb.OpenReweightingRequest(
            terms_json=t,
            rows=rows if isinstance(rows, pb.NDArray) else serde.to_pb(rows),
            scaling_mean=serde.to_pb(np.zeros(k)),
            scaling_std=serde.to_pb(np.ones(k) if std is None else std),
            basis=serde.to_pb(np.eye(k)[:, : rows_dim(rows)] if basis is None else basis),
            scale=scale,
            target_sig=signing.sign(self.key, t.encode()),
        )
        if labels is not None:
            req.labels.CopyFrom(serde.to_pb(labels))
        return self.stub.OpenReweighting(req, timeout=30)

    def steps(self, sid: str, start: int, count: int, head: str | None = None, length: int = 0):
        head = head_hash([]) if head is None else head
        req = pb.ReweightStepsRequest(
            session_id=sid, start=start, count=count, ledger_head=head, ledger_length=length
        )
        return self.stub.ReweightSteps(req, timeout=30)


def rows_dim(rows) -> int:
    return int(rows.shape[1]) if isinstance(rows, np.ndarray) else int(rows.shape[1])


@pytest.fixture
def hostile(tmp_path):
    dep = _deployment(tmp_path, peer_cap=1.2)
    with run_server(load_source(dep.source_config)) as rs:
        peer = _Peer(dep, rs.port)
        yield peer, rs.handlers
        peer.channel.close()


def _terms(**kw) -> ReweightingTerms:
    return ReweightingTerms(dataset="holder", epsilon=1.0, delta=DELTA, steps=10, **kw)


GOOD = np.array([[1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])


@pytest.mark.parametrize(
    "rows, field",
    [
        (np.array([[1e308, 0.0], [0.0, 1.0]]), "norm"),  # R would overflow Δ∞
        (np.zeros((1, 2)), "rows"),  # one row
        # rows of 1e-159 made Δ∞ = R²·μ/n underflow to 0, and the noise with it (the review)
        (np.full((3, 2), 1e-159), "largest row norm"),
        (np.zeros((3, K + 1)), "columns"),  # wider than the holder's features
    ],
)
def test_a_hostile_driver_cannot_open_with_rows_out_of_range(hostile, rows, field) -> None:
    peer, h = hostile
    with pytest.raises(grpc.RpcError) as err:
        peer.open(_terms(), rows)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert field in err.value.details()
    assert h.ledger.store.entries("holder") == [] and h.reweighting == {}


def test_non_finite_and_degenerate_maps_are_refused_or_tamed(hostile) -> None:
    peer, h = hostile
    nan = serde.to_pb(GOOD)
    nan.data = np.array([[np.nan, 0.0], [0.0, 1.0], [0.7, 0.7]]).tobytes()
    for kw in ({"rows": nan}, {"std": np.full(K, 1e-300)}, {"scale": 0.0}):
        rows = kw.pop("rows", GOOD)
        with pytest.raises(grpc.RpcError) as err:
            peer.open(_terms(), rows, **kw)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, kw
    assert h.reweighting == {}
    # a basis of 1e300 sends every mapped row to inf: the holder zeroes such rows (a per-row
    # rule), so the session opens and its sensitivity is still the bound for rows of norm ≤ 1
    resp = peer.open(_terms(), GOOD, basis=np.full((K, 2), 1e300))
    rs = h.reweighting[resp.session_id]
    assert np.all(np.isfinite(rs.moment)) and np.linalg.norm(rs.moment, 2) <= 1.0
    assert rs.sensitivity == pytest.approx(D.gradient_sensitivity(20.0, 1.0, 1.0, 500))


def test_a_hostile_driver_cannot_get_more_than_the_ledger_says(hostile) -> None:
    peer, h = hostile
    terms = _terms()
    sid = peer.open(terms, GOOD).session_id
    # steps out of order, past the session's steps, or none: refused, nothing charged
    for start, count in ((3, 2), (0, 11), (0, 0), (-1, 2)):
        with pytest.raises(grpc.RpcError) as err:
            peer.steps(sid, start, count)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert h.ledger.store.entries("holder") == []
    first = peer.steps(sid, 0, 4)
    entry = json.loads(first.entry_json)
    assert entry["dp_event"] == event_to_json(plan_reweighting(terms).event(4))
    # a replay of the same request gets the same outputs back, uncharged
    again = peer.steps(sid, 0, 4)
    assert again.vertices.data == first.vertices.data
    assert len(h.ledger.store.entries("holder")) == 1
    # the next block waits for the countersignature of the first (the peer's acknowledgement)
    with pytest.raises(grpc.RpcError) as err:
        peer.steps(sid, 4, 2, head_hash(h.ledger.store.entries("holder")), 1)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    # a second session cannot lift the peer's cap (1.2): ε = 1 each, composed ≈ 1.41 > 1.2
    e0 = h.ledger.store.entries("holder")[0]
    peer.stub.Countersign(
        pb.CountersignRequest(
            dataset="holder", seq=0, target_sig=signing.sign(peer.key, e0.signed_message())
        ),
        timeout=30,
    )
    head = head_hash(h.ledger.store.entries("holder"))
    peer.steps(sid, 4, 6, head, 1)  # the session's remaining steps: ε = 1 in all
    entries = h.ledger.store.entries("holder")
    peer.stub.Countersign(
        pb.CountersignRequest(
            dataset="holder", seq=1, target_sig=signing.sign(peer.key, entries[1].signed_message())
        ),
        timeout=30,
    )
    sid2 = peer.open(terms, GOOD).session_id
    with pytest.raises(grpc.RpcError) as err:
        peer.steps(sid2, 0, 10, head_hash(entries), 2)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "peer" in err.value.details()
    assert len(h.ledger.store.entries("holder")) == 2


def test_forward_sessions_are_refused_on_an_unlabeled_dataset(tmp_path) -> None:
    """A holder table without labels serves reweighting only."""
    data = tmp_path / "rows.csv"
    np.savetxt(data, np.random.default_rng(0).normal(size=(50, 3)), delimiter=",")
    dep = make_deployment(
        tmp_path,
        dataset={
            "name": "rows",
            "kind": "table",
            "path": str(data),
            "labeled": False,
            "epsilon": 10.0,
        },
        job={"dataset": "rows", "data_kind": "synthetic", "epsilon": 1.0, "delta": 1e-3},
        target_privacy={"disclosures": "exact"},
    )
    with run_server(load_source(dep.source_config)) as rs:
        from dpda.target_party.app import run

        cfg = load_target(dep.target_config)
        cfg = cfg.model_copy(update={"source_address": f"127.0.0.1:{rs.port}"})
        from dpda.errors import ConfigError

        with pytest.raises(ConfigError, match="no labels"):
            run(cfg, progress=False)
        assert rs.handlers.ledger.store.entries("rows") == []


def test_reweighting_outputs_past_the_storage_limit_are_refused_before_the_charge(tmp_path):
    """One session stored every block it was asked for (20,000 rows for 2,000 steps: 370 MiB).
    A block whose outputs would not fit the session's storage is refused naming the limit,
    with nothing charged or stored (blocks that fit: the other tests here, at the defaults)."""
    from dpda.errors import InvalidInput
    from dpda.service.config import SourceLimits
    from dpda.target_party.app import run_public_source_job

    dep = _deployment(tmp_path, method="noisy-md", steps=30)
    cfg = load_source(dep.source_config)
    block = 25 * 600 * 8  # a block of 25 noisy gradients over the 600 public rows
    tight = cfg.model_copy(update={"limits": SourceLimits(reweight_bytes_per_session=block - 1)})
    with run_server(tight) as rs:
        tcfg = load_target(dep.target_config)
        tcfg = tcfg.model_copy(update={"source_address": f"127.0.0.1:{rs.port}"})
        with pytest.raises(InvalidInput, match="POLICY_REFUSED.*reweight_bytes_per_session"):
            run_public_source_job(tcfg)
        assert rs.handlers.ledger.store.entries("holder") == []
        (n,) = rs.handlers.conn.execute("SELECT COUNT(*) FROM reweight_answers").fetchone()
        assert n == 0


def test_stored_reweighting_outputs_expire_and_a_replay_is_refused_uncharged(hostile) -> None:
    """Stored outputs older than ``limits.reweight_outputs_max_age_s`` are deleted and free
    their storage; a retry of such a block is refused naming the limit, with nothing charged
    or drawn again. The clock is the context's (injected here)."""
    from dpda.source_party import reweight_quota

    peer, h = hostile
    now = [1_000_000.0]
    h.ctx.clock = lambda: now[0]
    max_age = h.ctx.limits.reweight_outputs_max_age_s
    sid = peer.open(_terms(), GOOD).session_id
    first = peer.steps(sid, 0, 4)
    now[0] += max_age / 2  # younger than the limit: kept, a replay gets it back
    assert peer.steps(sid, 0, 4).vertices.data == first.vertices.data
    assert reweight_quota.stored_bytes(h.conn, "holder", [0]) > 0
    now[0] += max_age  # older now
    entries = h.ledger.store.entries("holder")
    with pytest.raises(grpc.RpcError) as err:
        peer.steps(sid, 0, 4)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "reweight_outputs_max_age_s" in err.value.details()
    assert h.ledger.store.entries("holder") == entries  # not charged, not drawn again
    assert reweight_quota.stored_bytes(h.conn, "holder", [0]) == 0  # its storage freed
    (n,) = h.conn.execute("SELECT COUNT(*) FROM reweight_answers").fetchone()
    assert n == 0


def test_the_outputs_age_limit_is_a_finite_positive_number() -> None:
    from pydantic import ValidationError

    from dpda.service.config import SourceLimits

    assert SourceLimits().reweight_outputs_max_age_s == 86400.0
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValidationError, match="reweight_outputs_max_age_s"):
            SourceLimits(reweight_outputs_max_age_s=bad)
