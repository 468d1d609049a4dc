"""``dpda bench accuracy --protocol consortium``: the leave-one-domain-out table's summary."""

from __future__ import annotations

import pytest

from tests.bench.consortium import summarize_consortium, summarize_several


def _cell(target: str, seed: int, kept: float, pooled: float) -> dict:
    sources = [d for d in "ACDW" if d != target]
    return {
        "target": target, "sources": sources, "seed": seed, "dpda": kept - 1, "kept": kept,
        "dp_no_adaptation": pooled, "source_only": 40.0, "source_only_logistic": 50.0,
        "otda": 55.0, "epsilon_spent_by_source": dict.fromkeys(sources, 7.99), "missing": {},
    }  # fmt: skip


def test_the_summary_compares_each_task_with_its_best_source_and_the_pooled_release() -> None:
    cells = [_cell("A", 0, 50.0, 40.0), _cell("A", 1, 46.0, 44.0), _cell("D", 0, 60.0, 65.0),
             _cell("W", 0, 64.11889596602971, 64.11889596602973)]  # fmt: skip
    singles = [
        {"source": "C", "target": "A", "seed": 0, "kept": 49.0},
        {"source": "C", "target": "A", "seed": 1, "kept": 47.0},
        {"source": "D", "target": "A", "seed": 0, "kept": 30.0},
        {"source": "W", "target": "A", "seed": 0, "kept": None},  # a run without a kept model
        {"source": "A", "target": "D", "seed": 0, "kept": 61.0},
    ]
    t = summarize_consortium(cells, singles)
    a = t["tasks"]["C+D+W→A"]
    assert a["kept"] == pytest.approx(48.0) and a["dp_no_adaptation"] == pytest.approx(42.0)
    assert a["best_single_source"] == "C" and a["best_single_source_kept"] == pytest.approx(48.0)
    assert a["single_source_kept"]["W"] is None and a["seeds"] == 2
    d = t["tasks"]["A+C+W→D"]
    assert d["best_single_source"] == "A" and d["largest_epsilon_spent"] == pytest.approx(7.99)
    # A: 48 ≥ 48 and 48 ≥ 42; D: 60 < 61 and 60 < 65; W: equal to the last bits, and no
    # one-source job ran (a best of nothing is no bar: 0)
    assert t["kept_at_least_best_single_source"] == 2
    assert t["kept_at_least_pooled_no_adaptation"] == 2 and t["n_tasks"] == 3


def test_the_several_source_families_table_averages_each_familys_seeds() -> None:
    def run(family: str, kept: float, spent: float) -> dict:
        return {
            "family": family, "dpda": kept - 5, "kept": kept, "dp_no_adaptation": 40.0,
            "source_only": None, "source_only_logistic": 50.0, "otda": 55.0,
            "epsilon_spent_by_source": {"s1": spent, "s2": 7.0},
        }  # fmt: skip

    cells = [run("text", 70.0, 7.9), run("images", 50.0, 7.5), run("text", 72.0, 7.99)]
    t = summarize_several(cells)
    assert list(t) == ["text", "images"]
    assert t["text"]["kept"] == pytest.approx(71.0) and t["text"]["dpda"] == pytest.approx(66.0)
    assert t["text"]["largest_epsilon_spent"] == pytest.approx(7.99)
    assert t["text"]["source_only"] is None  # no reference ran: no mean made up
    assert t["images"]["kept"] == pytest.approx(50.0)
