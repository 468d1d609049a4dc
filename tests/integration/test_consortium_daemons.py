"""A job over three real source daemons (three deployments: their own keys, policy, ledger and
port), one of which SIGKILLs itself mid-job: the job finishes on the other two, each source's
ledger holds its one charge and verifies against the target's copy of it, and the dead one was
charged once and never asked again."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from dpda.deployment import (
    SourceProcess,
    add_sources,
    dpda_command,
    run_target,
    trust_target_of,
)
from dpda.service.config import load_target
from dpda.service.crashpoints import ENV
from dpda.target_party.app import load_target_data, open_state, with_source_delta
from dpda.target_party.client import GrpcReleaseSource
from dpda.target_party.consortium import Consortium
from dpda.target_party.pipeline import run_dpda
from dpda.target_party.view import AdaptConfig, resolve_scaling, target_view

from .helpers import synthetic_deployment

# per-row L2 rows: a source-space release without DP preprocessing, what a consortium combines
JOB = {"representation": "l2"}
CRASH = "source.release.signed"  # the entry charged and signed, the release not yet sent


def _verify_both_ways(source: Path, target: Path) -> None:
    """``dpda ledger verify`` of each side against the other: OK both ways."""
    for mine, theirs in ((source, target), (target, source)):
        r = subprocess.run(
            dpda_command("ledger", "verify", str(mine), "--against", str(theirs)),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 0 and "checked: OK" in r.stdout, (mine, r.stdout, r.stderr)


def _entries(state: Path) -> int:
    with sqlite3.connect(state / "state.sqlite") as conn:
        return conn.execute("SELECT count(*) FROM ledger WHERE dataset='synthetic'").fetchone()[0]


@pytest.mark.soak  # three source daemons and a kill: CI runs it after the README's test command
def test_a_source_killed_mid_job_leaves_the_job_to_the_other_two_charged_once(
    tmp_path, monkeypatch
) -> None:
    deps = {f"s{k}": synthetic_deployment(tmp_path / f"s{k}", job=JOB) for k in range(3)}
    procs: dict[str, SourceProcess] = {}
    sources: dict[str, GrpcReleaseSource] = {}
    try:
        for name, dep in deps.items():
            if name == "s1":  # this daemon kills itself once its first release is signed
                monkeypatch.setenv(ENV, CRASH)
            else:
                monkeypatch.delenv(ENV, raising=False)
            procs[name] = SourceProcess(dep)
        monkeypatch.delenv(ENV, raising=False)
        cfgs = {}
        for name, dep in deps.items():
            # the dead source is given up on after 1 s of retries, not the default minute
            cfgs[name] = with_source_delta(load_target(dep.target_config)).model_copy(
                update={"reconnect_s": 1.0}
            )
        terms = cfgs["s0"].job.terms()
        table = load_target_data(cfgs["s0"])
        for name, cfg in cfgs.items():
            ledger, audit = open_state(cfg)
            sources[name] = GrpcReleaseSource(cfg, ledger, audit)
            sources[name].preflight(table.x.shape[1], terms.delta, planned=terms)
        con = Consortium(sources, {n: s.spent for n, s in sources.items()})
        view = target_view(
            table.domain,
            cfgs["s0"].job.representation,
            scaling_mode=resolve_scaling(cfgs["s0"].job.scaling, terms),
            terms=terms,
        )
        res = run_dpda(con, view, terms, AdaptConfig(seed=0), con.spent)
    finally:
        for s in sources.values():
            s.close()
        for p in procs.values():
            p.stop()
    assert res.accuracy is not None and res.accuracy > 50.0  # two sources' releases, adapted
    assert set(con.missing) == {"s1"} and con.in_job() == ["s0", "s2"]
    assert procs["s1"].proc.returncode == -9  # SIGKILL, at the crash point
    assert f"dpda crash point {CRASH}@1" in procs["s1"].log_path.read_text()
    for name, dep in deps.items():
        source, target = dep.workdir / "source", dep.workdir / "target"
        # one charge at each source, the dead one's too (it was signed before it died):
        # nothing twice, nothing at another source's ledger
        assert _entries(source) == 1, name
        if name == "s1":
            assert _entries(target) == 0  # the target never received it, and never re-asked
            continue
        assert _entries(target) == 1, name
        _verify_both_ways(source, target)
    spent = con.spent_by_source()  # each as the target's copy of that source's ledger reads it
    assert spent["s1"] == 0.0
    assert all(0.99 * terms.epsilon <= spent[n] <= terms.epsilon for n in ("s0", "s2"))


@pytest.fixture(autouse=True)
def _no_crash_env(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)


@pytest.mark.soak  # three sources, a kill, `dpda target run`: CI runs it after the README's command
def test_dpda_target_run_over_three_source_daemons_one_killed_mid_job(
    tmp_path, monkeypatch
) -> None:
    """``dpda target run`` with ``[[sources]]``: three organizations' source daemons, each
    trusting the one target; the second SIGKILLs itself at its signed release. The job ends on
    the other two, says which is missing, and keeps a ledger per source that verifies against
    that source's."""
    deps = {f"s{k}": synthetic_deployment(tmp_path / f"s{k}", job=JOB) for k in range(3)}
    target = deps["s0"]
    for name in ("s1", "s2"):
        trust_target_of(deps[name], target)
    procs: dict[str, SourceProcess] = {}
    try:
        for name, dep in deps.items():
            if name == "s1":
                monkeypatch.setenv(ENV, CRASH)
            else:
                monkeypatch.delenv(ENV, raising=False)
            procs[name] = SourceProcess(dep)
        monkeypatch.delenv(ENV, raising=False)
        add_sources(
            target, "s0", {n: (deps[n], f"127.0.0.1:{procs[n].port}") for n in ("s1", "s2")}
        )
        # the dead source is given up on after 1 s of retries, not the default minute
        target.target_config.write_text("reconnect_s = 1.0\n" + target.target_config.read_text())
        r = run_target(target, timeout=600)
    finally:
        for p in procs.values():
            p.stop()
    assert r.returncode == 0, r.stdout + r.stderr
    (results,) = (target.target_state / "jobs").glob("*/results.json")
    out = json.loads(results.read_text())
    assert set(out["sources"]) == {"s0", "s1", "s2"}
    assert set(out["consortium"]["missing"]) == {"s1"}
    assert out["epsilon_job_by_source"]["s1"] is None  # unknown here: on its own ledger
    for name in ("s0", "s2"):
        assert 0.99 * 4.0 <= out["epsilon_job_by_source"][name] <= 4.0
    assert out["accuracy"] is not None
    page = (results.parent / "report.html").read_text()  # each source's ε, or why not known
    privacy = page[page.index("<h2>Privacy</h2>") : page.index("<h2>Plots</h2>")]
    assert all(f"source {n}'s records" in privacy for n in ("s0", "s1", "s2"))
    assert privacy.count("left the job") == 1
    assert procs["s1"].proc.returncode == -9
    for name, dep in deps.items():
        mine = target.target_state / "sources" / name  # the target's copy of this source's
        assert _entries(dep.source_state) == 1, name  # one charge each, the dead one's too
        if name == "s1":
            assert _entries(mine) == 0
            continue
        assert _entries(mine) == 1, name
        _verify_both_ways(dep.source_state, mine)


@pytest.mark.soak  # three daemons and a job: CI runs it after the README's test command
def test_dpda_demo_runs_one_job_over_three_source_daemons(tmp_path, capsys) -> None:
    from dpda.cli.main import main

    out = tmp_path / "demo.json"
    rc = main(["demo", "--sources", "3", "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert data["ledger_verified"] is True and data["audit_verified"] is True
    assert set(data["sources"]) == {"org-a", "org-b", "org-c"} and not data["consortium"]["missing"]
    eps = data["epsilon_job_by_source"]
    assert set(eps) == set(data["sources"]) and all(0.99 * 4.0 <= v <= 4.0 for v in eps.values())
    printed = capsys.readouterr().out
    assert "target accuracy over 3 sources" in printed and "org-c: ε" in printed
    assert main(["demo", "--sources", "3", "--in-process"]) == 2  # the daemons, or nothing
    assert "no --in-process" in capsys.readouterr().err


@pytest.mark.soak  # three daemons and a serving target: CI runs it after the README's command
def test_the_jobs_api_runs_one_job_over_three_source_daemons(tmp_path) -> None:
    """``dpda target serve`` with ``[[sources]]``: a job posted to its API opens a session at
    each of three source daemons; its results give each source's ε, its report a row for each,
    and each source's ledger verifies against the target's copy."""
    import urllib.request

    from .helpers import start_target_serve

    deps = {f"s{k}": synthetic_deployment(tmp_path / f"s{k}", job=JOB) for k in range(3)}
    target = deps["s0"]
    for name in ("s1", "s2"):
        trust_target_of(deps[name], target)
    procs = {name: SourceProcess(dep) for name, dep in deps.items()}
    serve = None
    try:
        add_sources(
            target, "s0", {n: (deps[n], f"127.0.0.1:{procs[n].port}") for n in ("s1", "s2")}
        )
        serve, port = start_target_serve(target, tmp_path / "serve.log")
        token = (target.target_state / "admin_token").read_text().strip()

        def call(path: str, body: dict | None = None) -> dict:
            req = urllib.request.Request(
                f"http://127.0.0.1:{port}{path}",
                data=None if body is None else json.dumps(body).encode(),
                method="GET" if body is None else "POST",
                headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=30) as r:
                return json.loads(r.read()) if "report" not in path else {"html": r.read()}

        job_id = call("/v1/jobs", {"epsilon": 4.0})["id"]
        deadline = time.monotonic() + 300
        view = call(f"/v1/jobs/{job_id}")
        while view["state"] not in ("done", "failed") and time.monotonic() < deadline:
            time.sleep(0.2)
            view = call(f"/v1/jobs/{job_id}")
        assert view["state"] == "done", view
        results = view["results"]
        assert set(results["epsilon_job_by_source"]) == {"s0", "s1", "s2"}
        assert all(0.99 * 4.0 <= v <= 4.0 for v in results["epsilon_job_by_source"].values())
        assert not results["consortium"]["missing"]
        html = call(f"/v1/jobs/{job_id}/report")["html"].decode()
        assert all(f"source {n}'s records" in html for n in deps)
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(timeout=20)
        for p in procs.values():
            p.stop()
    for name, dep in deps.items():
        mine = target.target_state / "sources" / name
        assert _entries(dep.source_state) == 1 and _entries(mine) == 1, name
        _verify_both_ways(dep.source_state, mine)
