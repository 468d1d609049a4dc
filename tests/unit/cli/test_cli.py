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


def test_session_parameters_have_one_declaration() -> None:
    """The CLI flags and the target's [job] table take SessionTerms' defaults, constraints and
    choices (before: --pate-share was 0.25 on the command line and 0.1 in the config, and the
    config could not set noise_multiplier's companions)."""
    import dataclasses

    from dpda.cli.simulate import TERM_FLAGS, add_terms_args
    from dpda.service.config import TERMS_OF_JOB, TargetJob
    from dpda.target_party.view import ADAPT_KNOBS, AdaptConfig
    from dpda.terms import PATE_SHARE, RELEASE_DEPENDENT, SessionTerms

    parser = __import__("argparse").ArgumentParser()
    add_terms_args(parser)
    flags = {a.dest: a for a in parser._actions}
    terms, job = SessionTerms.model_fields, TargetJob.model_fields
    for name in TERM_FLAGS:
        assert name in TERMS_OF_JOB, f"{name}: a flag the target's config cannot set"
        if name in RELEASE_DEPENDENT:  # the unit / release decides (SessionTerms)
            assert flags[name].default is None and job[name].default is None
            continue
        assert flags[name].default == terms[name].default == job[name].default, name
        assert job[name].metadata == terms[name].metadata, f"{name}: constraints differ"
    assert set(TERMS_OF_JOB) - {"dataset", "epsilon", "delta"} == set(TERM_FLAGS)
    adapt = {f.name: f.default for f in dataclasses.fields(AdaptConfig)}
    for name in ADAPT_KNOBS:
        assert flags[name].default == job[name].default == adapt[name], name
    assert flags["pate_share"].default == job["pate_share"].default == PATE_SHARE
    assert flags["pate_queries"].default == job["pate_queries"].default


def _parsers():
    import argparse

    stack = [("dpda", build_parser())]
    while stack:
        name, p = stack.pop()
        yield name, p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                stack.extend((f"{name} {sub}", sp) for sub, sp in action.choices.items())


def test_every_flag_and_argument_has_help() -> None:
    import argparse

    bare = [
        f"{name} {a.option_strings or a.dest}"
        for name, p in _parsers()
        for a in p._actions
        if not isinstance(a, argparse._SubParsersAction) and not a.help
    ]
    assert bare == []


def test_one_flag_names_the_neighbouring_relation() -> None:
    for name, p in _parsers():
        flags = [a for a in p._actions if {"--relation", "--neighbouring"} & set(a.option_strings)]
        assert len(flags) <= 1, name  # one flag (its two spellings are one action)


def test_a_bad_value_is_one_line_not_the_usage(capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--epsilon", "abc"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err
    assert "--epsilon" in err and "'abc'" in err and "dpda simulate --help" in err


def test_the_package_ships_its_type_hints() -> None:
    from importlib.resources import files

    assert files("dpda").joinpath("py.typed").is_file()


def _subparsers(parser, path=()):
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, (*path, name))


def test_every_option_with_a_default_says_it_in_its_help() -> None:
    """A user reads each default in ``--help`` (``--keep`` among them): an option whose default
    is a value says ``default`` in its help."""
    import argparse

    from dpda.cli.main import build_parser

    silent = []
    for path, parser in _subparsers(build_parser()):
        for a in parser._actions:
            if not a.option_strings or a.help in (None, argparse.SUPPRESS):
                continue
            if isinstance(a, argparse._StoreTrueAction | argparse._HelpAction):
                continue
            if a.default is None or a.default == argparse.SUPPRESS or a.default == []:
                continue
            if "default" not in a.help:
                silent.append(f"{' '.join(path)} {a.option_strings[0]}")
    assert silent == []
