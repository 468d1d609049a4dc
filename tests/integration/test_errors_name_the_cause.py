"""What goes wrong at the client is said at the client, by name: δ taken from the source when
the target leaves it out, an unknown dataset, a certificate the source does not trust (at once,
naming which side refused). A real source daemon in its own process, real mTLS."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from dpda.deployment import Deployment, SourceProcess, dpda_command, make_deployment
from dpda.service.tls import init_party

N_SOURCE = 300


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("errors")
    dep = make_deployment(
        tmp / "deploy",
        dataset={"name": "syn", "kind": "synthetic", "synthetic_rows": [N_SOURCE, 200],
                 "epsilon": 10.0},
        job={"dataset": "syn", "data_kind": "synthetic", "synthetic_rows": [N_SOURCE, 200],
             "epsilon": 2.0,  # no delta: the source's is taken
             "projection": "target-pca"},  # a release that needs the target's statistics
        target_privacy={"disclosures": "exact"},
    )  # fmt: skip
    source = SourceProcess(dep)
    try:
        yield dep
    finally:
        source.stop()


def _variant(dep: Deployment, name: str, *swaps: tuple[str, str]) -> Path:
    text = dep.target_config.read_text()
    for old, new in swaps:
        assert old in text
        text = text.replace(old, new)
    path = dep.workdir / f"{name}.toml"
    path.write_text(text)
    return path


def _plan(config: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = dpda_command("target", "plan", "--config", str(config), *extra)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def test_the_target_takes_the_sources_delta_when_it_sets_none(served: Deployment) -> None:
    out = served.workdir / "plan.json"
    r = _plan(served.target_config, "--json", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["delta"] == 1.0 / (10.0 * N_SOURCE)


def test_an_unknown_dataset_is_named_at_the_client(served: Deployment) -> None:
    config = _variant(served, "unknown", ('dataset = "syn"', 'dataset = "nope"'))
    r = _plan(config)
    assert r.returncode != 0
    assert "job.dataset" in r.stderr and "'nope'" in r.stderr, r.stderr


def test_a_certificate_the_source_does_not_trust_fails_at_once(served: Deployment) -> None:
    other = init_party(served.workdir / "other-keys", "target-org")  # a CA the source never saw
    keys = served.target_keys
    config = _variant(
        served, "untrusted", (str(keys.cert), str(other.cert)), (str(keys.key), str(other.key))
    )
    r = _plan(config)
    assert r.returncode != 0
    assert "tls.cert" in r.stderr and "refused this target's certificate" in r.stderr, r.stderr
    assert "retrying" not in r.stderr  # a setting, not an outage: nothing is retried


def test_plan_checks_the_targets_privacy_and_suggests_a_free_bound(served: Deployment) -> None:
    config = _variant(served, "raw-dp", ('disclosures = "exact"', 'disclosures = "dp"'))
    r = _plan(config)
    assert r.returncode != 0  # as the job itself would fail, before anything is asked
    assert "privacy.row_clip" in r.stderr and 'job.representation = "l2"' in r.stderr, r.stderr


def test_plan_and_run_show_both_parties_epsilon(served: Deployment) -> None:
    swap = ('disclosures = "exact"', 'disclosures = "dp"\nrow_clip = 40.0')
    config = _variant(served, "both", swap)
    out = served.workdir / "both.json"
    r = _plan(config, "--json", str(out))
    assert r.returncode == 0, r.stderr
    plan = json.loads(out.read_text())
    own = plan["target"]
    assert own["disclosures"] == "dp" and 0 < own["epsilon_charge"] <= own["epsilon_total_after"]
    assert f"the target's own rows ε {own['epsilon_charge']:.4f}" in r.stdout
    assert f"the source's records ε {plan['epsilon_charge']:.4f}" in r.stdout
    run = subprocess.run(
        dpda_command("target", "run", "--config", str(config), "--quiet"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "the source's records: ε" in run.stdout
    assert f"the target's own rows: ε {own['epsilon_charge']:.4f} this job" in run.stdout


def _own_state(dep: Deployment, name: str) -> tuple[str, str]:
    """The swap that gives a variant a target state of its own (a ledger that starts empty)."""
    return f'state_dir = "{dep.workdir / "target"}"', f'state_dir = "{dep.workdir / name}"'


def _run_job(config: Path) -> subprocess.CompletedProcess:
    cmd = dpda_command("target", "run", "--config", str(config), "--quiet")
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def _own_entries(state: Path) -> list:
    import sqlite3

    if not (state / "state.sqlite").is_file():
        return []
    with sqlite3.connect(state / "state.sqlite") as conn:
        return conn.execute("SELECT * FROM ledger WHERE dataset = 'own-rows'").fetchall()


def test_a_rounded_delta_is_refused_before_the_targets_rows_are_charged(
    served: Deployment,
) -> None:
    config = _variant(
        served, "rounded", _own_state(served, "rounded"),
        ('disclosures = "exact"', 'disclosures = "dp"\nrow_clip = 40.0'),
        ("[job]\n", "[job]\ndelta = 0.000333\n"),  # the source's is 1/3000
    )  # fmt: skip
    r = _run_job(config)
    assert r.returncode != 0
    assert "job.delta" in r.stderr and "leave job.delta out" in r.stderr, r.stderr
    assert _own_entries(served.workdir / "rounded") == []  # nothing of the target charged


def test_a_budget_refusal_names_whose_budget_and_its_setting(served: Deployment) -> None:
    config = _variant(
        served, "small", _own_state(served, "small"),
        ("budget_epsilon = 100.0", "budget_epsilon = 0.5"),
    )  # fmt: skip
    plan = _plan(config)
    assert plan.returncode == 1, plan.stdout + plan.stderr  # a job that does not fit
    assert "does NOT fit" in plan.stdout and "(budget_epsilon)" in plan.stdout, plan.stdout
    r = _run_job(config)
    assert r.returncode != 0
    assert "the target's own budget for the source's dataset 'syn' (budget_epsilon)" in r.stderr


def test_the_target_daemon_starts_without_job_delta(served: Deployment, tmp_path: Path) -> None:
    from tests.integration.helpers import start_target_serve

    assert "delta" not in served.target_config.read_text().split("[job]")[1].split("[")[0]
    proc, port = start_target_serve(served, tmp_path / "serve.log")
    try:
        assert port > 0 and proc.poll() is None
    finally:
        proc.terminate()
        proc.wait(timeout=30)
