"""The joint mechanism of a record-unit aggregate release (``LabelBranchDpEvent``): its event,
its serialisation, the ledger's maximum over label branches and the exact calibration."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import dp_event

from dpda.dp.accounting import LEDGER_PLD_INTERVAL, epsilon_of
from dpda.dp.calibration import calibrate_sigma, exact_noise_scale
from dpda.dp.events import (
    BatchSpec,
    FeatureSpec,
    HistogramSpec,
    LabelBranchDpEvent,
    branch_of,
    event_from_json,
    event_to_json,
)
from dpda.dp.ledger import Budget, MemoryLedgerStore, PrivacyLedger, spend_of, totals_by_relation
from dpda.dp.work_bounds import CalibrationTimeout, time_limit
from dpda.planner import plan_batches
from dpda.terms import SessionTerms

DELTA = 1e-5
G = dp_event.GaussianDpEvent
DLAP = dp_event.DiscreteLaplaceDpEvent


def _joint(sigma: float = 0.8, a: float = 0.4, ratio: float = math.sqrt(2)) -> LabelBranchDpEvent:
    return LabelBranchDpEvent(
        same_label=G(sigma),
        label_change=dp_event.ComposedDpEvent([G(sigma * ratio), DLAP(a, 1), DLAP(a, 1)]),
    )


def _spend(events: list[dp_event.DpEvent]) -> float:
    return spend_of(events, DELTA)


# ------------------------------------------------------------------------------ the spec
def _spec(relation: str = "replace-one", cross: float | None = math.sqrt(2)) -> BatchSpec:
    return BatchSpec(
        FeatureSpec(0.8, 2.0, "record", relation, label_change_sensitivity=cross),
        HistogramSpec("discrete_laplace", 0.4, 2 if relation == "replace-one" else 1),
    )


def test_the_spec_charges_the_joint_event_of_its_own_noise() -> None:
    spec = _spec()
    # σ·S_same per sums coordinate, DLap(a) per count: the same noise as the composition
    assert spec.features.noise_std == pytest.approx(1.6)
    assert spec.dp_event() == LabelBranchDpEvent(
        same_label=G(0.8),
        label_change=dp_event.ComposedDpEvent(
            [G(0.8 * 2.0 / math.sqrt(2)), DLAP(0.4, 1), DLAP(0.4, 1)]
        ),
    )


def test_without_a_label_change_sensitivity_or_under_add_remove_the_charge_is_composed() -> None:
    assert _spec(cross=None).dp_event() == dp_event.ComposedDpEvent([G(0.8), DLAP(0.4, 2)])
    # add/remove: one class's sums and its count move together, no branch
    add_remove = _spec("add-remove", cross=None).dp_event()
    assert add_remove == dp_event.ComposedDpEvent([G(0.8), DLAP(0.4, 1)])
    terms = SessionTerms(dataset="d", epsilon=2.0, delta=DELTA, neighbouring="add-remove")
    plan = plan_batches(terms, 500, np.eye(5))
    assert plan.feature_label_change_sensitivity is None
    assert isinstance(plan.spec(terms).dp_event(), dp_event.ComposedDpEvent)


# ----------------------------------------------------------------------- serialisation
def test_the_event_round_trips_and_old_entries_read_as_before() -> None:
    ev = _joint()
    data = event_to_json(ev)
    assert data["type"] == "LabelBranchDpEvent"
    assert event_from_json(data) == ev
    nested = dp_event.SelfComposedDpEvent(dp_event.ComposedDpEvent([ev, G(3.0)]), 4)
    assert event_from_json(event_to_json(nested)) == nested
    old = {
        "type": "ComposedDpEvent",
        "events": [
            {"type": "GaussianDpEvent", "noise_multiplier": 1.2566},
            {"type": "DiscreteLaplaceDpEvent", "noise_parameter": 2.0, "sensitivity": 2},
        ],
    }
    assert event_from_json(old) == dp_event.ComposedDpEvent([G(1.2566), DLAP(2.0, 2)])


def test_malformed_branch_entries_are_refused() -> None:
    data = event_to_json(_joint())
    with pytest.raises(ValueError):
        event_from_json({**data, "extra": 1})  # a field the format does not have
    with pytest.raises(ValueError):
        event_from_json({k: v for k, v in data.items() if k != "label_change"})
    with pytest.raises(ValueError):  # a branch inside a branch has no meaning
        event_from_json({**data, "same_label": data})
    with pytest.raises(TypeError):
        LabelBranchDpEvent(same_label="gaussian", label_change=G(1.0))  # type: ignore[arg-type]


# ------------------------------------------------------------------------------ accounting
def test_one_release_is_the_larger_branch() -> None:
    ev = _joint()
    same = _spend([branch_of(ev, "same_label")])
    change = _spend([branch_of(ev, "label_change")])
    assert _spend([ev]) == max(same, change)
    # the same-label branch is a Gaussian: its ε is the closed form (analytic Gaussian)
    assert same == pytest.approx(dp_accounting.get_epsilon_gaussian(0.8, DELTA), abs=1e-4)
    assert epsilon_of([ev], DELTA, "pld", LEDGER_PLD_INTERVAL) == pytest.approx(
        _spend([ev]), abs=1e-6
    )
    # the composition charged before is looser than both branches together
    assert _spend([ev]) < _spend([dp_event.ComposedDpEvent([G(0.8), DLAP(0.4, 2)])]) - 0.3


def test_two_counts_moving_by_one_cost_less_than_one_count_moving_by_two() -> None:
    """The label-change counts: two independent DLap(a) coordinates each moved by one (exact)
    are charged below DLap(a) on one count moved by 2 (what the composition charged)."""
    for a in (0.1, 0.5, 1.0):
        two = _spend([dp_event.ComposedDpEvent([DLAP(a, 1), DLAP(a, 1)])])
        assert two < _spend([DLAP(a, 2)])
        assert two <= 2 * a + 1e-9  # pure 2a-DP either way


def test_composition_takes_one_branch_for_every_release() -> None:
    """Two releases of the dataset: the total is the larger of the all-same-label and the
    all-label-change compositions (a pair is of one kind for every release), below the
    composition charged before; an event without branches composes into both."""
    ev = _joint(sigma=1.2, a=0.5)
    same, change = branch_of(ev, "same_label"), branch_of(ev, "label_change")
    total = _spend([ev, ev])
    assert total == pytest.approx(max(_spend([same, same]), _spend([change, change])), abs=1e-9)
    old = dp_event.ComposedDpEvent([G(1.2), DLAP(0.5, 2)])
    assert total < _spend([old, old]) - 0.1
    pate = DLAP(0.3, 1)  # no branches: in both
    with_pate = _spend([ev, pate, ev])
    assert with_pate == pytest.approx(
        max(_spend([same, pate, same]), _spend([change, pate, change])), abs=1e-9
    )
    assert with_pate > total


def test_rdp_takes_the_larger_branch_too() -> None:
    ev = _joint()
    rdp = epsilon_of([ev], DELTA, "rdp")
    branches = [
        epsilon_of([branch_of(ev, b)], DELTA, "rdp") for b in ("same_label", "label_change")
    ]
    assert rdp == max(branches)


def test_the_ledger_charges_and_totals_branched_entries() -> None:
    ledger = PrivacyLedger(MemoryLedgerStore(), {"d": Budget(10.0, DELTA)})
    ev = _joint()
    for i in range(2):
        ledger.charge(
            dataset="d",
            events=[ev],
            session="s",
            peer="p",
            request_id=f"r{i}",
            privacy_unit="record",
            neighbouring="replace-one",
            params={"delta": DELTA},
        )
    entries = ledger.store.entries("d")
    assert entries[-1].spend_after == pytest.approx(_spend([ev, ev]), abs=1e-12)
    assert ledger.spent("d") == pytest.approx(_spend([ev, ev]), abs=1e-12)
    assert totals_by_relation(entries) == {
        "attribute": ledger.spent("d"),
        "record": ledger.spent("d"),
    }


# ----------------------------------------------------------------------------- calibration
def test_exact_calibration_spends_what_is_granted_and_never_more() -> None:
    def events(s: float) -> list[dp_event.DpEvent]:
        return [_joint(sigma=s, a=0.25, ratio=1.5)]

    for eps in (1.0, 6.0):
        s = exact_noise_scale(events, eps, DELTA, key=("test joint", 0.25, 1.5))
        spent = _spend(events(s))
        assert 0.999 * eps <= spent <= eps
        assert _spend(events(s * (1 - 2e-3))) > eps  # a little less noise would overspend
    sigma = calibrate_sigma(2.0, DELTA, "exact")
    assert _spend([G(sigma)]) <= 2.0
    assert sigma <= calibrate_sigma(2.0, DELTA, "analytic") * (1 + 1e-6)


def test_exact_calibration_at_a_tiny_epsilon() -> None:
    """ε = 0.01 with counts at a = 0.0025: the coarse grid's rounding alone would exceed ε, so
    the search keeps to a grid fine enough for it and still spends what is granted."""

    def events(s: float) -> list[dp_event.DpEvent]:
        return [_joint(sigma=s, a=0.0025)]

    s = exact_noise_scale(events, 0.01, DELTA, key=("tiny ε", 0.0025))
    assert 0.0099 <= _spend(events(s)) <= 0.01


def test_exact_calibration_keeps_the_time_limit() -> None:
    with time_limit(0.0), pytest.raises(CalibrationTimeout):
        exact_noise_scale(
            lambda s: [_joint(sigma=s, a=0.123)], 3.0, DELTA, key=("time-limited", 0.123)
        )


def test_theorem2_and_analytic_stay_selectable_and_are_charged_the_joint_event() -> None:
    for method in ("theorem2", "analytic"):
        terms = SessionTerms(dataset="d", epsilon=4.0, delta=DELTA, calibration=method)
        assert terms.histogram_share == 0.1  # the release's default share
        plan = plan_batches(terms, 500, np.eye(5))
        ev = plan.spec(terms).dp_event()
        assert isinstance(ev, LabelBranchDpEvent)
        assert _spend([ev]) < 4.0
    exact = SessionTerms(dataset="d", epsilon=4.0, delta=DELTA)
    assert exact.calibration == "exact" and exact.release == "prototypes"
    assert _spend(plan_batches(exact, 500, np.eye(5)).events(exact)) >= 0.99 * 4.0
