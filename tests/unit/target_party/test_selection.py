"""The unsupervised choice of (λe, λg): post-processing that never reads the target's labels."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dpda.data.synthetic import two_domains
from dpda.simulation import simulate
from dpda.target_party.selection import GRID
from dpda.target_party.view import AdaptConfig
from dpda.terms import SessionTerms

pytestmark = pytest.mark.slow  # every test here runs the selection over several jobs


def _run(target, select: str = "circular"):
    s, _ = two_domains(400, 300, seed=1)
    terms = SessionTerms(dataset="s", epsilon=8.0, delta=1e-4, projection_dim=10)
    return simulate(
        s, target, terms, "raw", AdaptConfig(select=select), seed=3, baselines=False
    ).dpda


def test_the_choice_is_the_same_with_or_without_target_labels() -> None:
    _, t = two_domains(400, 300, seed=1)
    labeled = _run(t)
    blind = _run(dataclasses.replace(t, y=None, n_classes=0))
    assert labeled.selection["method"] == blind.selection["method"] == "circular"
    assert (labeled.selection["reg_e"], labeled.selection["reg_g"]) == (
        blind.selection["reg_e"],
        blind.selection["reg_g"],
    )
    assert np.array_equal(labeled.predictions, blind.predictions)
    assert labeled.epsilon_spent == blind.epsilon_spent  # no extra budget for the choice
    cands = labeled.selection["candidates"]
    assert [(c["reg_e"], c["reg_g"]) for c in cands] == list(GRID)
    assert all("accuracy" in c for c in cands)  # reported beside the score …
    assert not any("accuracy" in c for c in blind.selection["candidates"])  # … only when known
    assert blind.accuracy is None


def test_select_none_keeps_the_configured_pair() -> None:
    _, t = two_domains(400, 300, seed=1)
    res = _run(t, select="none")
    assert res.selection == {"method": "none", "reg_e": 0.02, "reg_g": 0.5}
