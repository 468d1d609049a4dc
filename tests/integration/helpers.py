"""Shared fixtures for integration tests: real keys, real configs, real servers on port 0."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from dpda.deployment import Deployment, dpda_command, make_deployment

DELTA = 1.0 / (1.2 * 600)
# the target's opt-ins to what it disclosed before issue 19 (exact statistics, exact PATE rows):
# the tests that compare with in-process runs or exercise PATE run under them
EXACT_TARGET = {"disclosures": "exact", "row_queries": "exact"}
# a source that opts into the attribute unit (and so into per-row releases) besides the defaults
ATTRIBUTE_POLICY = {
    "units": ["record", "attribute"],
    "attribute_unit_exposes_labels_and_membership": True,
    "releases": ["rows", "prototypes", "class-gaussians"],
}


def synthetic_deployment(
    tmp: Path,
    *,
    epsilon: float = 4.0,
    peer_cap: float = 100.0,
    target_budget: float = 100.0,
    dataset_cap: float | None = None,
    job: dict[str, Any] | None = None,
    seed: int | None = None,
    retain: bool = False,
    attribute_unit: bool = False,
    reweighting: bool = False,
    target_privacy: dict[str, Any] | None = None,
    metric: bool = False,
) -> Deployment:
    """``attribute_unit``: the source opts into the attribute unit and row releases, and the job
    asks for it (per-row minibatches need it; the default policy releases record aggregates).
    ``reweighting``: the source also opts into reweighting sessions (the reverse shape).
    ``target_privacy``: the target's ``[privacy]``; by default ``EXACT_TARGET``, so that these
    tests compare with the in-process runs (which disclose exactly by default); ``{}`` is the
    target's default policy (DP disclosures; PATE asks about synthetic points)."""
    extra: dict[str, Any] = {"retain_payloads": retain}
    if seed is not None:
        extra["seed"] = seed
        extra["insecure_testing"] = True
    base_job = {
        "dataset": "synthetic",
        "data_kind": "synthetic",
        "epsilon": epsilon,
        "delta": DELTA,
        "projection_dim": 10,
    }
    dataset: dict[str, Any] = {
        "name": "synthetic",
        "kind": "synthetic",
        "epsilon": dataset_cap if dataset_cap is not None else 100.0,
        "delta": DELTA,
    }
    if attribute_unit:
        # σ calibrated to the steps: under the attribute relation sampling amplifies δ, not ε
        base_job.update({"privacy_unit": "attribute", "noise_multiplier": 0.0})
        dataset["policy"] = dict(ATTRIBUTE_POLICY)
    if reweighting:
        dataset["policy"] = {**dataset.get("policy", {}), "allow_reweighting": True}
    if metric:  # the source opts into the learned ground cost
        dataset["policy"] = {**dataset.get("policy", {}), "allow_metric": True}
    base_job.update(job or {})
    return make_deployment(
        tmp,
        dataset=dataset,
        job=base_job,
        source_extra=extra,
        peer_cap=peer_cap,
        target_budget=target_budget,
        target_privacy=EXACT_TARGET if target_privacy is None else target_privacy,
    )


class SignedStub:
    """A raw source stub that signs its ``OpenSession`` terms with the target's key, as a real
    target does (the source refuses unsigned terms); everything else passes through."""

    def __init__(self, stub: Any, dep: Deployment) -> None:
        from dpda.service import signing

        self._stub = stub
        self._key = signing.load_private(dep.target_keys.signing_key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stub, name)

    def OpenSession(self, request: Any, **kw: Any) -> Any:
        from dpda.service import signing

        if not request.target_sig:
            request.target_sig = signing.sign(self._key, request.terms_json.encode())
        return self._stub.OpenSession(request, **kw)


def handlers_with(**parts: type) -> type:
    """A ``SourceHandlers`` whose RPC families named in ``parts`` (``sessions``, ``batches``,
    ``pate``) are the given subclasses: a source that misbehaves in one step only."""
    from dpda.source_party.handlers import SourceHandlers

    return type("Handlers", (SourceHandlers,), {f"{k}_class": v for k, v in parts.items()})


def start_target_serve(dep: Any, log_path: Path) -> tuple[subprocess.Popen, int]:
    """``dpda target serve`` as a real process; (process, admin port) once it listens."""
    port_file = dep.target_state / "admin_port"
    dep.target_state.mkdir(parents=True, exist_ok=True)
    port_file.unlink(missing_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            dpda_command("target", "serve", "--config", str(dep.target_config)),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not port_file.is_file():
        assert proc.poll() is None and time.monotonic() < deadline, "target serve did not start"
        time.sleep(0.05)
    return proc, int(port_file.read_text())


def need(ok: object, reason: str) -> None:
    """Skip with ``reason`` unless ``ok``; in CI (``CI=true``) fail instead: the parts CI
    installs (Chromium, Docker, debootstrap) must run there, never skip."""
    import os

    import pytest

    if ok:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true and {reason}: .ci/run installs it; a skip here would hide a break")
    pytest.skip(reason)
