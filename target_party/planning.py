"""``dpda target plan``: what a job will charge, before anything is spent.

The target asks the source for its public facts (``DescribeDataset``: rows, policy, δ and the
budget numbers against the caps that bind this peer), brings its copy of the ledger up to date
(``GetLedger``, verified; nothing is charged), makes the same choices from its own rows the job
makes (basis, clipping norm) and computes the release plan both parties compute — so σ and the
charge are the job's, not an estimate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from dpda.dp.ledger import spend_of
from dpda.dp.pate import answers_event
from dpda.errors import ConfigError, PeerMisbehaved
from dpda.planner import plan_batches
from dpda.policy import PrivacyPolicy
from dpda.service.config import TargetConfig
from dpda.target_party.app import load_target_data, open_state, with_source_delta
from dpda.target_party.client import GrpcReleaseSource
from dpda.target_party.forecast import NOISE_DOMINATED, forecast
from dpda.target_party.own_rows import own_plan
from dpda.target_party.resources import job_resources
from dpda.target_party.view import AdaptConfig, resolve_scaling, session_terms, target_view


def plan_job(cfg: TargetConfig) -> dict[str, Any]:
    """σ, the job's charge and what remains on both sides, before and after the job."""
    cfg = with_source_delta(cfg)
    terms = cfg.job.terms()
    if terms.projection == "jl":
        raise ConfigError(
            "job.projection: 'jl' is drawn by the source when the session opens, so its plan is "
            "known only then; dpda target plan covers target-pca (the default)"
        )
    table = load_target_data(cfg)
    own = own_plan(cfg, table, terms)  # the target's [privacy], checked before the source is asked
    view = target_view(
        table.domain,
        cfg.job.representation,
        scaling_mode=resolve_scaling(cfg.job.scaling, terms),
        terms=terms,
    )
    ledger, audit = open_state(cfg)
    source = GrpcReleaseSource(cfg, ledger, audit)
    try:
        facts = source.preflight(view.x.shape[1], terms.delta)
        source.sync_ledger()  # the target's copy of the dataset's ledger, verified
    finally:
        source.close()
    if terms.dpda and facts.n_classes < 2:
        raise ConfigError(
            f"job.dataset: the source's dataset {terms.dataset!r} holds {int(facts.n_classes)} "
            "class(es); adaptation needs labeled rows of at least two classes"
        )
    terms, basis = session_terms(
        view, terms, AdaptConfig(seed=0), (int(facts.n_rows), int(facts.n_classes))
    )
    if basis is None:  # a source-space release: the identity on the source's features
        basis = np.eye(int(facts.n_features), 1)  # the plan reads the terms, not the width
    try:
        policy = PrivacyPolicy.model_validate_json(facts.policy_json)
    except ValueError:  # pydantic's ValidationError: the peer sent it, its text is not shown
        raise PeerMisbehaved("the source's policy does not parse") from None
    plan = plan_batches(
        terms,
        int(facts.n_rows),
        basis,
        attribute_bound=policy.attribute_bound,
        scaling_std=view.scaling.std,
    )
    events = []
    spec = plan.spec(terms)
    channels: dict[str, list[Any]] = {"features": [], "histogram": [], "metric": [], "pate": []}
    channels["preprocessing"] = []
    pre = plan.preprocessing_spec(terms) if terms.dpda else None
    if pre is not None:  # the source's DP standardization, charged with the first release
        events.append(pre.dp_event())
        channels["preprocessing"] = [pre.dp_event()]
    if terms.dpda:
        events += [spec.dp_event()] * plan.steps
        if terms.privacy_unit == "attribute":  # the histogram is uncharged under this unit
            channels["features"] = [spec.dp_event()] * plan.steps
        else:
            channels["features"] = [spec.features.dp_event()] * plan.steps
            channels["histogram"] = [spec.histogram.dp_event()] * plan.steps
        metric = plan.metric_spec(terms)
        if metric is not None:  # cost = metric: one more release of the session
            events.append(metric.dp_event())
            channels["metric"] = [metric.dp_event()]
    if plan.pate_scale is not None and plan.pate_queries > 0:
        pate = answers_event(terms.pate_aggregator, plan.pate_scale, plan.pate_queries)
        events.append(pate)
        channels["pate"] = [pate]
    charge = spend_of(events, terms.delta)
    # each channel alone at the job's δ; composition is sub-additive, so they sum to more
    by_channel = {k: spend_of(v, terms.delta) if v else 0.0 for k, v in channels.items()}
    held = ledger.store.entries(terms.dataset)
    from dpda.dp.events import event_from_json

    prior = [event_from_json(e.dp_event) for e in held]
    dataset_after = spend_of([*prior, *events], terms.delta)
    target_spent = ledger.spent(terms.dataset)
    remaining = {
        "source_dataset": facts.dataset_epsilon_cap - facts.dataset_epsilon_spent,
        "source_peer": facts.peer_epsilon_cap - facts.peer_epsilon_spent,
        "target_budget": cfg.budget_epsilon - target_spent,
    }
    return {
        "forecast": forecast(terms, plan, int(facts.n_rows), int(facts.n_classes), view.x.shape[0]),
        "resources": job_resources(
            terms,
            plan.steps,
            int(facts.n_rows),
            int(facts.n_classes),
            view.x.shape[0],
            view.x.shape[1],
            select=cfg.job.select,
        ),
        "sigma": plan.feature_noise_multiplier,
        "noise_std": plan.spec(terms).features.noise_std,
        "steps": plan.steps,
        "sampling_rate": plan.sampling_rate,
        "projection_dim": terms.projection_dim,
        "privacy_unit": str(terms.privacy_unit),
        "pate_queries": plan.pate_queries,
        # what the source estimates under DP before the release (its C and scales come with the
        # first release; the job's result reports them)
        "preprocessing": {
            "mode": terms.preprocessing if pre is not None else "none",
            "share": pre.share if pre is not None else None,
            "noise_multiplier": plan.preprocessing_noise_multiplier,
            "columns": plan.preprocessing_columns if pre is not None else 0,
        },
        "epsilon_charge": charge,  # this job alone
        "epsilon_by_channel": by_channel,  # each alone; their sum exceeds the composed charge
        "epsilon_remaining": max(0.0, min(remaining.values())),  # now, before the job
        "epsilon_remaining_by_cap": remaining,
        "epsilon_dataset_after": dataset_after,  # the dataset's composed total after the job
        "epsilon_dataset_cap": facts.dataset_epsilon_cap,
        "fits": dataset_after <= facts.dataset_epsilon_cap + 1e-12
        and charge <= remaining["source_peer"] + 1e-12
        and dataset_after <= cfg.budget_epsilon + 1e-12
        and own["fits"],
        "delta": terms.delta,
        "target": own,  # the target's own rows: this job's ε on its ledger, its cap
        "source": {
            "n_rows": int(facts.n_rows),
            "n_features": int(facts.n_features),
            "n_classes": int(facts.n_classes),
            "representation": facts.representation,
        },
    }


__all__ = ["plan_job", "forecast", "NOISE_DOMINATED"]
