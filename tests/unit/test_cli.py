"""``--json`` means the same in every command (issue 14): a path, or ``-``/no value for standard
output, which then carries the JSON and nothing else."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpda.cli.main import build_parser, main

SIGMA = ["privacy", "sigma", "--epsilon", "1", "--delta", "1e-5"]


@pytest.mark.parametrize("flag", [["--json"], ["--json", "-"]])
def test_json_on_standard_output_is_json_only(flag: list[str], capsys) -> None:
    assert main([*SIGMA, *flag]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["sigma"] > 0


def test_json_to_a_file_keeps_the_text(tmp_path: Path, capsys) -> None:
    path = tmp_path / "sigma.json"
    assert main([*SIGMA, "--json", str(path)]) == 0
    assert json.loads(path.read_text())["sigma"] > 0
    captured = capsys.readouterr()
    assert captured.out.startswith("σ = ")  # the text, as without --json
    assert f"wrote {path}" in captured.err


def test_every_json_option_takes_a_path_or_dash() -> None:
    """No command keeps a flag-only ``--json``: each one accepts OUT and defaults to stdout."""
    parser = build_parser()
    seen = 0
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:
            if action.option_strings == ["--json"]:
                seen += 1
                assert (action.nargs, action.const, action.metavar) == ("?", "-", "OUT"), p.prog
            for sub in getattr(action, "choices", None) or {}:
                if isinstance(action.choices, dict):
                    stack.append(action.choices[sub])
    assert seen >= 15
