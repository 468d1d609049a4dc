"""`dpda bench speed` runs end to end on a tiny problem and writes the JSON the issue names."""

from __future__ import annotations

import json

from common.cli import main


def test_bench_speed_smoke(tmp_path, capsys) -> None:  # noqa: ANN001
    out = tmp_path / "speed.json"
    assert main(["bench", "speed", "--sizes", "500", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    for key in ("ot_gl", "sinkhorn"):
        row = data[key][0]
        assert set(row) == {
            "n",
            "ours_s",
            "pot_s",
            "ratio",
            "ours_peak_mb",
            "pot_peak_mb",
            "plan_agreement",
        }
        assert row["n"] == 500 and row["ours_s"] > 0 and row["pot_s"] > 0
        assert row["plan_agreement"] > 0.95  # the same problem, nearly the same plan
    assert "plan agreement" in capsys.readouterr().out
