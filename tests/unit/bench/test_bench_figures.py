"""The paper-reproduction benches run end to end on small inputs and their numbers behave."""

from __future__ import annotations

import json

import pytest

from dpda.cli.main import main
from tests.bench.accuracy import paper_epsilon
from tests.bench.accuracy_tpami import PUBLISHED_OT_GL
from tests.bench.harness import parse_pairs

pytestmark = pytest.mark.slow  # every test here takes seconds (real daemons or long runs)

PNG = b"\x89PNG\r\n\x1a\n"


def test_dpot_error_grows_with_noise_and_writes_a_plot(tmp_path) -> None:
    out, png = tmp_path / "dpot.json", tmp_path / "dpot.png"
    argv = ["bench", "dpot-error", "--dataset", "synthetic", "--ratios", "0", "1.5"]
    argv += ["--runs", "2", "--batch-runs", "20", "--batch-size", "64", "--projection-dim", "20"]
    assert main([*argv, "--json", str(out), "--png", str(png)]) == 0
    data = json.loads(out.read_text())
    for key in ("whole_batch", "minibatch"):
        clean, noisy = data[key]
        # no noise: only the JL distortion; σ/w = 1.5 adds error and moves plan mass
        assert clean["err"] < noisy["err"]
        assert clean["plan_agreement"] > noisy["plan_agreement"]
        assert 0 <= noisy["plan_agreement"] <= 1
        assert clean["err_noise"] == 0.0 and noisy["err_noise"] > 0  # no noise, no noise error
    assert png.read_bytes()[:8] == PNG


def test_pairs_and_protocol_constants() -> None:
    assert parse_pairs(["C:A", "m:u"]) == [("C", "A"), ("M", "U")]
    assert len(parse_pairs(None)) == 14 and set(PUBLISHED_OT_GL) == {
        f"{s}→{t}" for s, t in parse_pairs(None)
    }
    assert paper_epsilon("D") == paper_epsilon("W") == 20.0 and paper_epsilon("C") == 8.0
    with pytest.raises(ValueError, match="--pairs"):
        parse_pairs(["C:U"])


@pytest.mark.data
@pytest.mark.soak  # a benchmark's short run: CI runs it after the README's test command (-m soak)
def test_bench_accuracy_one_pair_both_protocols(data_dir, tmp_path) -> None:
    out = tmp_path / "acc.json"
    argv = ["bench", "accuracy", "--data-dir", str(data_dir), "--pairs", "D:W", "--seeds", "1"]
    argv += ["--units", "attribute", "--runs", "1", "--json", str(out)]
    assert main(argv) == 0
    data = json.loads(out.read_text())
    (run,) = data["dpda_paper"]["runs"]
    assert run["epsilon"] == 20.0 and run["batches"] > 1  # minibatches at the paper's ε for D
    for col in ("source_only", "otda", "dpda", "pate", "dpda_pate"):
        assert 0 <= run[col] <= 100
    assert max(run["epsilon_spent"].values()) <= 20.0
    (tp,) = data["otda_tpami"]["runs"]
    assert tp["ot_gl"]["reg_e"] in (1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3)
    # D→W is the easy pair: chosen on validation, OT-GL beats 1-NN on the raw source
    assert tp["ot_gl"]["test"] > tp["source_only"]
    assert data["otda_tpami"]["table"]["D→W"]["published_ot_gl"] == 81.06


@pytest.mark.data
def test_privacy_utility_writes_table_and_plot(data_dir, tmp_path) -> None:
    out, png = tmp_path / "pu.json", tmp_path / "pu.png"
    argv = ["bench", "privacy-utility", "--data-dir", str(data_dir), "--pairs", "W:D"]
    argv += ["--epsilons", "1", "8", "--seeds", "1", "--json", str(out), "--png", str(png)]
    assert main(argv) == 0
    table = json.loads(out.read_text())["table"]
    assert [r["epsilon"] for r in table] == [1, 8]
    # the non-private line does not depend on ε; DPDA at ε = 8 beats DPDA at ε = 1 on W→D
    assert table[0]["otda"] == table[1]["otda"]
    assert table[1]["dpda"] > table[0]["dpda"]
    assert png.read_bytes()[:8] == PNG


@pytest.mark.data
def test_label_leak_reads_labels_off_attribute_rows(data_dir, tmp_path) -> None:
    """The figure the README quotes for what the attribute unit gives away: the nearest noisy
    row's block gives the record's label far more often than the largest class would."""
    out = tmp_path / "leak.json"
    argv = ["bench", "label-leak", "--data-dir", str(data_dir), "--pairs", "W:D"]
    assert main([*argv, "--epsilons", "8", "--json", str(out)]) == 0
    (run,) = json.loads(out.read_text())["runs"]
    assert run["label_accuracy"] > 3 * run["largest_class"]
    assert run["epsilon_spent"] <= 8.0
