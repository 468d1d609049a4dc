"""``dpda bench``: the benchmarks come from the checkout, on one harness."""

from __future__ import annotations

import pytest

from dpda.cli import bench
from dpda.cli.main import build_parser, main


def test_the_benchmarks_are_found_in_the_checkout_not_the_package() -> None:
    root = bench.checkout()
    assert root is not None and (root / "tests" / "bench" / "harness.py").is_file()
    import dpda

    assert not (root / "common" / "bench").exists()
    assert not hasattr(dpda, "bench")


def test_without_a_checkout_dpda_bench_says_where_the_benchmarks_are(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(bench, "checkout", lambda: None)
    assert main(["bench", "speed", "--json", "out.json"]) == 2
    err = capsys.readouterr().err
    assert "tests/bench" in err and "editable_mode=strict" in err


def test_the_shared_flags_are_declared_once_with_the_same_meaning() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command").choices["bench"]
    commands = next(a for a in sub._actions if a.dest == "bench_command").choices
    helps: dict[str, set[str]] = {}
    for cmd in commands.values():
        for action in cmd._actions:
            if action.dest == "data_dir":
                helps.setdefault("data_dir", set()).add(action.help)
    assert len(helps["data_dir"]) == 1  # one declaration: one help text
    assert len([c for c in commands.values() if any(a.dest == "data_dir" for a in c._actions)]) >= 7
