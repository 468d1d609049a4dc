"""Shared fixtures for integration tests: real keys, real configs, real servers on port 0."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common.deployment import Deployment, make_deployment

DELTA = 1.0 / (1.2 * 600)


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
) -> Deployment:
    extra: dict[str, Any] = {"retain_payloads": retain}
    if seed is not None:
        extra["seed"] = seed
    base_job = {
        "dataset": "synthetic",
        "data_kind": "synthetic",
        "epsilon": epsilon,
        "delta": DELTA,
        "projection_dim": 10,
    }
    base_job.update(job or {})
    return make_deployment(
        tmp,
        dataset={
            "name": "synthetic",
            "kind": "synthetic",
            "epsilon": dataset_cap if dataset_cap is not None else 100.0,
            "delta": DELTA,
        },
        job=base_job,
        source_extra=extra,
        peer_cap=peer_cap,
        target_budget=target_budget,
    )
