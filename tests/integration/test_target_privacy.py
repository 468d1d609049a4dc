"""Each party owns its privacy (issue 19): under the target's default ``[privacy]`` policy no
exact statistic or row of the target leaves it; what it sends is charged to its own signed
ledger, checked by the source, and listed by ``dpda audit report`` on the target."""

from __future__ import annotations

import json
import subprocess

import grpc
import numpy as np
import pytest

from dpda.data.preprocessing import Scaling, per_row
from dpda.data.synthetic import two_domains
from dpda.deployment import dpda_command, set_source_address
from dpda.errors import BudgetExceeded, ConfigError, LedgerCorrupt, PeerMisbehaved
from dpda.service import signing
from dpda.service.config import load_source, load_target
from dpda.source_party.app import run_server
from dpda.source_party.rpc_pate import PateQueries
from dpda.source_party.rpc_sessions import Sessions
from dpda.target_party.app import open_state, run
from dpda.target_party.own_rows import OWN_ROWS
from dpda.target_party.view import target_pca_basis

from .helpers import handlers_with, synthetic_deployment

DEFAULT = {"row_clip": 15.0}  # the default policy; raw rows need their norm bound


class _Recording(Sessions):
    """An honest source that keeps what the target sent it."""

    seen: list = []

    def open_session(self, peer, terms_json, scaling, basis, *args, **kw):  # type: ignore[override]
        type(self).seen.append((json.loads(terms_json), scaling, basis))
        return super().open_session(peer, terms_json, scaling, basis, *args, **kw)


def _run(dep, port):
    set_source_address(dep, f"127.0.0.1:{port}")
    return run(load_target(dep.target_config), progress=False)


def test_with_the_default_policy_no_exact_statistic_leaves_the_target(tmp_path) -> None:
    dep = synthetic_deployment(
        tmp_path, target_privacy=DEFAULT, job={"projection_dim": 5, "projection": "target-pca"}
    )
    _Recording.seen = []
    with run_server(load_source(dep.source_config), handlers_with(sessions=_Recording)) as rs:
        out = _run(dep, rs.port)
        again = _run(dep, rs.port)  # the same job again: the stored disclosure, uncharged
    (terms, scaling, basis), (terms2, scaling2, basis2) = _Recording.seen
    _, t = two_domains()
    rep = per_row(t.x, "raw")
    exact = Scaling.of(rep, "zscore")
    exact_basis = target_pca_basis(exact.apply(rep), 5)
    exact_clip = float(np.quantile(np.linalg.norm(exact.apply(rep) @ exact_basis, axis=1), 0.9))
    # nothing exact: means, scales, directions (up to sign) and the clip norm all differ
    assert np.max(np.abs(scaling.mean - exact.mean)) > 1e-3
    assert np.max(np.abs(scaling.std - exact.std)) > 1e-3
    assert np.max(np.abs(np.abs(basis) - np.abs(exact_basis))) > 1e-3
    assert abs(terms["clip_norm"] - exact_clip) > 1e-6
    assert out["target_disclosures"] == "dp"
    # the target's own ledger: one charge, ε of its policy, signed by the target
    ledger, _ = open_state(load_target(dep.target_config))
    own = ledger.store.entries(OWN_ROWS)
    assert len(own) == 1 and own[0].params["kind"] == "target-disclosure"
    assert out["target_epsilon_spent"] == pytest.approx(4.0, rel=1e-6) == own[0].params["epsilon"]
    pub = signing.load_public(dep.target_keys.signing_pub)
    assert signing.verify(pub, own[0].signed_message(), own[0].target_sig)
    # the rerun sent the very same DP statistics and charged nothing new
    assert np.array_equal(scaling2.mean, scaling.mean) and np.array_equal(basis2, basis)
    assert again["target_epsilon_total"] == pytest.approx(out["target_epsilon_total"])
    # the audit report lists each disclosure with its mechanism and ε; the ledger verifies
    rep_json = tmp_path / "report.json"
    subprocess.run(
        dpda_command("audit", "report", str(dep.target_state), "--json", str(rep_json)),
        check=True,
        capture_output=True,
    )
    found = json.loads(rep_json.read_text())["disclosures"]
    assert [d["method"] for d in found] == ["OpenSession", "OpenSession"]
    assert all("analyze-gauss" in d["mechanism"] for d in found)
    assert all(d["epsilon"] == pytest.approx(4.0) for d in found)
    verify = subprocess.run(
        dpda_command("ledger", "verify", str(dep.target_state)), capture_output=True, text=True
    )
    assert verify.returncode == 0, verify.stdout + verify.stderr


def test_the_exact_opt_in_is_listed_as_unprotected(tmp_path) -> None:
    dep = synthetic_deployment(
        tmp_path, job={"projection_dim": 5, "projection": "target-pca"}
    )  # disclosures = "exact"
    with run_server(load_source(dep.source_config)) as rs:
        out = _run(dep, rs.port)
    assert out["target_disclosures"] == "exact" and out["target_epsilon_spent"] is None
    from dpda.service.audit import AuditLog, report
    from dpda.service.verify import open_state as verify_state

    conn, store = verify_state(str(dep.target_state))
    rep = report(AuditLog(conn, ""), {(e.dataset, e.seq): e for e in store.entries()})
    assert [(d["method"], d["mechanism"], d["epsilon"]) for d in rep["disclosures"]] == [
        ("OpenSession", "exact", None)
    ]


class _Opened(Sessions):
    """An honest source's sessions that keep the target's disclosure."""

    opened: list = []

    def open_session(self, peer, terms_json, scaling, basis, *args, **kw):  # type: ignore[override]
        type(self).opened.append((scaling, basis))
        return super().open_session(peer, terms_json, scaling, basis, *args, **kw)


class _Queried(PateQueries):
    """An honest source's PATE answers that keep every query it receives."""

    queries: list = []

    def query_teachers(self, peer, session_id, index, queries, *args, **kw):  # type: ignore[override]
        type(self).queries.append(np.array(queries))
        return super().query_teachers(peer, session_id, index, queries, *args, **kw)


def _nearest_row_distance(queries: np.ndarray) -> float:
    """How close the closest query came to a target row, in the session's projected space (the
    scaling and basis the target sent; the source can compute this for its own part)."""
    (scaling, basis), *_ = _Opened.opened
    _, t = two_domains()
    rows = scaling.apply(per_row(t.x, "raw")) @ basis
    d2 = ((queries[:, None, :] - rows[None, :, :]) ** 2).sum(axis=2)
    return float(np.sqrt(d2.min()))


@pytest.mark.parametrize(
    ("method", "row_queries"),
    [("pate", "exact"), ("pate", "synthetic"), ("dpda+pate", "synthetic"), ("pate", "dp")],
)
def test_pate_sends_target_rows_only_under_the_exact_opt_in(tmp_path, method, row_queries):
    """Default (synthetic) and dp: no query is a target row (each is farther from every row than
    rounding); the exact opt-in sends the rows themselves (distance 0), so the check can fail.
    Each form is in the target's own signed ledger and its audit report, with its ε. (Each
    session's queries are their own disclosure: a resumed session resends the stored ones, a
    new session draws and is charged anew.)"""
    privacy = {**DEFAULT, "row_queries": row_queries}
    if row_queries == "exact":
        privacy = {"disclosures": "exact", "row_queries": "exact"}
    dep = synthetic_deployment(
        tmp_path, target_privacy=privacy, job={"projection_dim": 5, "method": method}
    )
    _Opened.opened, _Queried.queries = [], []
    with run_server(
        load_source(dep.source_config), handlers_with(sessions=_Opened, pate=_Queried)
    ) as rs:
        out = _run(dep, rs.port)
    sent = np.vstack(_Queried.queries)
    assert sent.shape[0] == out["pate_queries"] > 0
    nearest = _nearest_row_distance(sent)
    if row_queries == "exact":
        assert nearest < 1e-9
        assert out["target_epsilon_spent"] is None
        return
    assert nearest > 1e-3
    ledger, _ = open_state(load_target(dep.target_config))
    own = ledger.store.entries(OWN_ROWS)
    kinds = [e.params["kind"] for e in own]
    assert kinds == ["target-disclosure", "target-row-queries"]
    q = own[1]
    pub = signing.load_public(dep.target_keys.signing_pub)
    assert signing.verify(pub, q.signed_message(), q.target_sig)
    from dpda.protocol import payload_digest

    assert q.payload_sha256 == payload_digest(np.ascontiguousarray(sent, dtype="<f8").tobytes())
    want = 0.0 if row_queries == "synthetic" else 4.0  # query_epsilon's default
    assert q.params["epsilon"] == pytest.approx(want, abs=1e-6)
    total = out["target_epsilon_total"]  # the own ledger's composed ε after the job
    assert out["target_row_queries"] == row_queries
    assert out["target_epsilon_spent"] == pytest.approx(total)  # one job: all of it
    if row_queries == "dp":  # the disclosure's and the queries' Gaussians, composed
        from dpda.dp.events import event_from_json
        from dpda.dp.ledger import spend_of

        events = [event_from_json(e.dp_event) for e in own]
        assert total == pytest.approx(spend_of(events, own[0].params["delta"]), rel=1e-9)
        assert 4.0 < total < 4.0 + q.params["epsilon"]
    else:
        assert total == pytest.approx(4.0, rel=1e-6)
    rep_json = tmp_path / "report.json"
    subprocess.run(
        dpda_command("audit", "report", str(dep.target_state), "--json", str(rep_json)),
        check=True,
        capture_output=True,
    )
    found = [d for d in json.loads(rep_json.read_text())["disclosures"]]
    teachers = [d for d in found if d["method"] == "QueryTeachers"]
    assert teachers and all(d["epsilon"] == pytest.approx(want, abs=1e-6) for d in teachers)
    assert all(d["mechanism"] == ("gaussian" if row_queries == "dp" else "post-processing")
               for d in teachers)  # fmt: skip


def test_raw_row_queries_need_the_exact_opt_in(tmp_path) -> None:
    dep = synthetic_deployment(
        tmp_path,
        target_privacy=DEFAULT,
        job={"projection_dim": 5, "method": "pate", "pate_space": "raw"},
    )
    with run_server(load_source(dep.source_config)) as rs:
        with pytest.raises(ConfigError, match="row_queries"):
            _run(dep, rs.port)
        assert rs.handlers.ledger.store.entries("synthetic") == []
    ledger, _ = open_state(load_target(dep.target_config))
    assert ledger.store.entries(OWN_ROWS) == []  # refused before anything was charged


def test_dp_row_queries_need_dp_disclosures() -> None:
    from pydantic import ValidationError

    from dpda.policy import TargetPrivacyPolicy

    with pytest.raises(ValidationError, match="row_queries: dp"):
        TargetPrivacyPolicy(disclosures="exact", row_queries="dp")
    with pytest.raises(ValidationError, match="query_epsilon"):
        TargetPrivacyPolicy(row_queries="dp", query_epsilon=9.0)


class _Greedy(Sessions):
    """A hostile source: it plans PATE queries the target never asked for, to get its rows."""

    def plan(self, releaser, terms, disclosure, projection=None):  # type: ignore[override]
        asked = terms.model_copy(update={"pate_epsilon": 1.0, "pate_queries": 200})
        return super().plan(releaser, asked, disclosure, projection)


def test_a_source_cannot_make_the_target_send_rows(tmp_path) -> None:
    dep = synthetic_deployment(
        tmp_path, target_privacy=DEFAULT, job={"projection_dim": 5, "projection": "target-pca"}
    )
    with run_server(load_source(dep.source_config), handlers_with(sessions=_Greedy)) as rs:
        with pytest.raises(PeerMisbehaved, match="plan"):
            _run(dep, rs.port)
        methods = [r.method for r, _ in rs.audit.records()]
    assert not any(m.endswith("QueryTeachers") for m in methods)


def test_the_source_refuses_a_forged_disclosure_claim(tmp_path) -> None:
    """A claim over other arrays, or unsigned, is a misbehaving peer (the source's log would
    otherwise say what the target spent, wrongly)."""
    from dpda.pb import dpda_pb2 as pb
    from dpda.pb import dpda_pb2_grpc as pb_grpc
    from dpda.service import serde
    from dpda.service.tls import channel_credentials

    dep = synthetic_deployment(
        tmp_path, target_privacy=DEFAULT, job={"projection_dim": 5, "projection": "target-pca"}
    )
    with run_server(load_source(dep.source_config)) as rs:
        _run(dep, rs.port)  # an honest job: a real claim to tamper with
        ledger, _ = open_state(load_target(dep.target_config))
        claim = ledger.store.entries(OWN_ROWS)[0]
        k = dep.target_keys
        key = signing.load_private(k.signing_key)
        with grpc.secure_channel(
            f"127.0.0.1:{rs.port}", channel_credentials(k.cert, k.key, k.ca)
        ) as ch:
            stub = pb_grpc.SourceServiceStub(ch)
            terms = json.dumps({"dataset": "synthetic", "epsilon": 1.0, "delta": 1 / 720,
                                "projection": "jl", "projection_dim": 5})  # fmt: skip
            base = pb.OpenSessionRequest(
                terms_json=terms,
                target_sig=signing.sign(key, terms.encode()),
                scaling_mean=serde.to_pb(np.zeros(40)),
                scaling_std=serde.to_pb(np.ones(40)),
            )
            # ε = NaN or a params list: no canonical form, so no signature can cover them
            text = claim.to_json()  # canonical: no spaces
            eps = json.dumps(claim.params["epsilon"])
            tampered = [
                text.replace('"target_sig":"', '"x":"'),  # malformed
                text.replace(f'"epsilon":{eps}', '"epsilon":NaN'),
                text.replace('"params":{', '"params":[{', 1),
            ]
            assert all(t != text for t in tampered)  # each one really is tampered with
            for forged in (text, *tampered):  # the first: honest, but over other arrays
                req = pb.OpenSessionRequest()
                req.CopyFrom(base)
                req.target_claim_json = forged
                with pytest.raises(grpc.RpcError) as err:
                    stub.OpenSession(req, timeout=30)
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


class _Replaying(PateQueries):
    """A hostile source that fails the target's first PATE request after reading it, hoping
    that the rerun of the job draws the noise on the same rows again (two noisy looks at each
    row for one charge)."""

    queries: list = []
    failed = False

    def query_teachers(self, peer, session_id, index, queries, *args, **kw):  # type: ignore[override]
        type(self).queries.append(np.array(queries))
        if not type(self).failed:
            type(self).failed = True
            raise RuntimeError("a fault the source made up")
        return super().query_teachers(peer, session_id, index, queries, *args, **kw)


def test_a_replaying_source_gets_the_same_noisy_rows_again_for_one_charge(tmp_path) -> None:
    dep = synthetic_deployment(
        tmp_path,
        target_privacy={**DEFAULT, "row_queries": "dp"},
        job={"projection_dim": 5, "method": "pate"},
    )
    _Replaying.queries, _Replaying.failed = [], False
    with run_server(load_source(dep.source_config), handlers_with(pate=_Replaying)) as rs:
        with pytest.raises(Exception):  # noqa: B017 - the job fails on the source's fault
            _run(dep, rs.port)
        out = _run(dep, rs.port)  # the operator reruns it: the same session resumes
    first, *rest = _Replaying.queries
    assert rest and all(np.array_equal(first, q) for q in rest)  # the very same noisy rows
    ledger, _ = open_state(load_target(dep.target_config))
    queried = [
        e for e in ledger.store.entries(OWN_ROWS) if e.params["kind"] == "target-row-queries"
    ]
    assert len(queried) == 1  # charged once
    assert out["target_row_queries"] == "dp"


class _Renaming(_Replaying):
    """A hostile source that fails the first PATE request and answers the rerun's resumed
    session with a new session id (``_Renamed``), hoping for a second charge (and a second
    noisy copy of the same rows)."""


class _Renamed(Sessions):
    def open_session(self, peer, terms_json, scaling, basis, session_id="", *args, **kw):  # type: ignore[override]
        return super().open_session(peer, terms_json, scaling, basis, "", *args, **kw)


def test_a_source_that_renames_the_resumed_session_is_refused_and_charges_nothing(tmp_path):
    dep = synthetic_deployment(
        tmp_path,
        target_privacy={**DEFAULT, "row_queries": "dp"},
        job={"projection_dim": 5, "method": "pate"},
    )
    _Renaming.queries, _Renaming.failed = [], False
    tcfg = load_target(dep.target_config)
    with run_server(
        load_source(dep.source_config), handlers_with(sessions=_Renamed, pate=_Renaming)
    ) as rs:
        with pytest.raises(Exception):  # noqa: B017 - the job fails on the source's fault
            _run(dep, rs.port)
        ledger, _ = open_state(tcfg)
        spent = [e.spend_after for e in ledger.store.entries(OWN_ROWS)]
        for _ in range(2):
            with pytest.raises(PeerMisbehaved, match="another id"):
                _run(dep, rs.port)
    ledger, _ = open_state(tcfg)
    # no rerun grew the target's own-rows spend
    assert [e.spend_after for e in ledger.store.entries(OWN_ROWS)] == spent
    assert len(_Renaming.queries) == 1  # and no second noisy copy of the rows left


def test_the_same_jobs_row_queries_are_charged_once_whatever_the_session(tmp_path) -> None:
    """A rerun of the same job that the source gives a new session (its old one lost) sends
    the stored noisy rows again, uncharged."""
    dep = synthetic_deployment(
        tmp_path,
        target_privacy={**DEFAULT, "row_queries": "dp"},
        job={"projection_dim": 5, "method": "pate"},
    )
    _Replaying.queries, _Replaying.failed = [], False
    tcfg = load_target(dep.target_config)
    with run_server(load_source(dep.source_config), handlers_with(pate=_Replaying)) as rs:
        with pytest.raises(Exception):  # noqa: B017 - the job fails on the source's fault
            _run(dep, rs.port)
        ledger, _ = open_state(tcfg)
        spent = [e.spend_after for e in ledger.store.entries(OWN_ROWS)]
        (tcfg.state_dir / "job.json").unlink()  # the session is not resumed: a new one opens
        _run(dep, rs.port)
    ledger, _ = open_state(tcfg)
    assert [e.spend_after for e in ledger.store.entries(OWN_ROWS)] == spent
    first, *rest = _Replaying.queries
    assert rest and all(np.array_equal(first, q) for q in rest)


class _AlwaysFailing(PateQueries):
    """A hostile source that fails every PATE request after reading it."""

    def query_teachers(self, *args, **kw):  # type: ignore[override]
        raise RuntimeError("a fault the source made up")


def test_reruns_of_a_job_the_source_keeps_failing_are_bounded(tmp_path) -> None:
    dep = synthetic_deployment(
        tmp_path,
        target_privacy={**DEFAULT, "row_queries": "dp"},
        job={"projection_dim": 5, "method": "pate"},
    )
    with run_server(load_source(dep.source_config), handlers_with(pate=_AlwaysFailing)) as rs:
        set_source_address(dep, f"127.0.0.1:{rs.port}")
        tcfg = load_target(dep.target_config).model_copy(update={"max_reruns": 2})
        for _ in range(2):
            with pytest.raises(Exception):  # noqa: B017 - the job fails on the source's fault
                run(tcfg, progress=False)
        asked = len(rs.audit.records())
        with pytest.raises(ConfigError, match="max_reruns"):
            run(tcfg, progress=False)
        assert len(rs.audit.records()) == asked  # refused before the source is asked anything


def test_pate_queries_beyond_the_targets_cap_are_refused_before_the_source_charges(tmp_path):
    dep = synthetic_deployment(
        tmp_path,
        target_privacy={**DEFAULT, "row_queries": "dp", "query_epsilon": 8.0},
        job={"projection_dim": 5, "method": "dpda+pate"},
    )
    with run_server(load_source(dep.source_config)) as rs:
        with pytest.raises(BudgetExceeded):
            _run(dep, rs.port)
        assert rs.handlers.ledger.store.entries("synthetic") == []  # nothing was released
    ledger, _ = open_state(load_target(dep.target_config))
    assert ledger.store.entries(OWN_ROWS) == []  # both checked before either charge (4 + 8 > 8)


def test_a_lost_copy_of_a_sent_disclosure_is_refused_not_redrawn(tmp_path) -> None:
    dep = synthetic_deployment(
        tmp_path, target_privacy=DEFAULT, job={"projection_dim": 5, "projection": "target-pca"}
    )
    with run_server(load_source(dep.source_config)) as rs:
        _run(dep, rs.port)
        (stored,) = dep.target_state.glob("disclosure-*.npz")
        stored.unlink()
        with pytest.raises(LedgerCorrupt, match="stored copy"):
            _run(dep, rs.port)
    ledger, _ = open_state(load_target(dep.target_config))
    assert len(ledger.store.entries(OWN_ROWS)) == 1  # no new charge, no new draw
