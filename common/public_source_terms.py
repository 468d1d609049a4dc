"""The public-source setting's terms and plan: a party with public labeled rows asks the data
holder (the serving daemon, whose rows are private) for the DP steps of a private discrepancy
minimisation (``dpda.dp.discrepancy``). Both parties compute the plan from the public terms."""

from __future__ import annotations

import functools
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from dpda.planner import PlanRefused


class ReweightingTerms(BaseModel):
    """Terms of a reweighting session (the public-source deployment): the party with public labeled
    rows asks the data holder — the serving daemon, whose rows are private — for the DP steps of
    a private discrepancy minimisation (``dpda.dp.discrepancy``). Public; the holder's policy and
    ledger decide, and the guarantee reads nothing here but ε, δ and the step count (Δ∞ comes
    from the holder's own clip and row count and from the rows it actually received)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    dataset: str = Field(min_length=1, max_length=128)
    method: Literal["noisy-fw", "noisy-md", "single-stage"] = "noisy-fw"
    epsilon: float = Field(gt=0, le=100, description="budget of this session (ε)")
    delta: float = Field(gt=0, lt=1)
    steps: int = Field(default=1000, ge=1, le=100_000, description="optimisation steps")
    smoothing: float = Field(
        default=20.0, ge=0.01, le=1e4, description="μ of the smooth discrepancy F̃"
    )
    ridge: float = Field(default=1e-3, ge=0, le=1e3, description="λ on ‖q‖²")
    learning_rate: float = Field(default=0.5, gt=0, le=100, description="noisy-md: η")
    predictor_radius: float = Field(default=2.0, gt=0, le=1e3, description="single-stage: Λ")
    representation: Literal["raw", "sqrt", "rownorm", "l2"] = "raw"


class ReweightingPlan(BaseModel):
    """What each step costs, from public terms only: ε₀ of one exponential-mechanism step
    (Frank–Wolfe methods) or σ of one Gaussian step (mirror descent). Both parties compute it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: str
    steps: int
    step_parameter: float

    def event(self, count: int) -> Any:
        from dpda.dp.discrepancy import step_event

        return step_event(self.method, self.step_parameter, count)


@functools.lru_cache(maxsize=64)
def plan_reweighting(terms: ReweightingTerms) -> ReweightingPlan:
    """The per-step parameter whose ``steps`` steps spend at most ε at δ under the ledger's
    accounting (``ledger.spend_of``: the smaller of PLD and RDP for exponential-mechanism steps)."""
    from dpda.dp.discrepancy import step_parameter
    from dpda.dp.ledger import spend_of

    p = step_parameter(terms.method, terms.epsilon, terms.delta, terms.steps)
    plan = ReweightingPlan(method=terms.method, steps=terms.steps, step_parameter=p)
    if spend_of([plan.event(terms.steps)], terms.delta) > terms.epsilon * (1 + 1e-9):
        raise PlanRefused(
            f"steps: {terms.steps} steps cannot spend as little as ε {terms.epsilon:g} "
            "(the noise search ends at its bound)"
        )
    return plan


def reweighter(terms: ReweightingTerms, rows: np.ndarray, labels: np.ndarray | None) -> Any:
    """The session's optimiser over the public ``rows`` (``discrepancy.Reweighter``): the one
    state both parties advance, built the same way on both sides."""
    from dpda.dp.discrepancy import Reweighter

    return Reweighter(
        rows,
        terms.method,
        mu=terms.smoothing,
        ridge=terms.ridge,
        y=labels,
        learning_rate=terms.learning_rate,
        predictor_radius=terms.predictor_radius,
    )
