"""Errors that name their cause: the config key behind a typo, the field behind a missing file,
a key that is not the certificate's, a δ that protects nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpda.cli.main import main
from dpda.dp.ledger import check_delta
from dpda.errors import ConfigError
from dpda.service.config import load_source, load_target
from dpda.service.tls import check_server_fingerprint, init_party, tls_files


def test_a_misspelt_key_is_named_with_the_key_it_resembles(tmp_path: Path) -> None:
    path = tmp_path / "target.toml"
    path.write_text('budget_epsillon = 3\nsource_address = "localhost:1"\n')
    with pytest.raises(
        ConfigError, match="budget_epsillon: unknown key .*did you mean 'budget_epsilon'"
    ):
        load_target(path)
    path = tmp_path / "source.toml"
    path.write_text('[[datasets]]\nname = "a"\nknd = "table"\n')
    with pytest.raises(ConfigError, match=r"datasets\.0\.knd: .*did you mean 'kind'"):
        load_source(path)


@pytest.fixture(scope="module")
def keys(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("keys")
    return init_party(out / "a", "a-org"), init_party(out / "b", "b-org")


def test_a_missing_key_file_names_its_field(keys, tmp_path: Path) -> None:
    a, _ = keys
    with pytest.raises(ConfigError, match=r"tls\.key: .*gone\.key: no such file"):
        check_server_fingerprint("127.0.0.1:1", a.cert, tmp_path / "gone.key", a.ca, "x")


def test_a_key_of_another_certificate_is_refused_by_name(keys) -> None:
    a, b = keys
    assert tls_files(a.cert, a.key, a.ca)[0].startswith(b"-----BEGIN CERTIFICATE")
    with pytest.raises(ConfigError, match=r"tls\.key: .*b-org\.key is not the key of .*tls\.cert"):
        check_server_fingerprint("127.0.0.1:1", a.cert, b.key, a.ca, "x")


def test_a_delta_of_one_over_n_or_more_is_refused() -> None:
    check_delta(0.9 / 100, 100, "delta", "the source")
    with pytest.raises(
        ConfigError, match=r"--delta: δ = 0\.5 must lie in \(0, 1/n\) = \(0, 0\.01\)"
    ):
        check_delta(0.5, 100, "--delta", "the source")


def test_simulate_refuses_a_delta_above_one_over_n(tmp_path: Path, capsys) -> None:
    rows = "\n".join(f"{i % 3},{i % 5},{i % 2}" for i in range(40))
    (tmp_path / "s.csv").write_text("a,b,label\n" + rows + "\n")
    (tmp_path / "t.csv").write_text("a,b\n" + "\n".join(f"{i},{i + 1}" for i in range(20)) + "\n")
    code = main([
        "simulate", "--source-file", str(tmp_path / "s.csv"), "--target-file",
        str(tmp_path / "t.csv"), "--label-column", "label", "--delta", "0.5",
        "--predictions", str(tmp_path / "p.csv"),
    ])  # fmt: skip
    assert code != 0
    assert "--delta: δ = 0.5" in capsys.readouterr().err
    assert not (tmp_path / "p.csv").exists()
