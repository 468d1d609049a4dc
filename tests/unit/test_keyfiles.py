"""Key and state files are private from the first byte (hardening issue, items 7 and 12).

On 9ac3bc1 ``keys init`` opened existing files with O_TRUNC and chmod-ed afterwards (a file
another user pre-created stayed readable by that user), keys were created 0666 & ~umask before
the chmod, and ``state.sqlite`` was 0644.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from dpda.cli.main import main
from dpda.errors import ConfigError
from dpda.service.keyfiles import private_dir, write_private
from dpda.service.ledger_store import connect


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_keys_init_leaves_the_directory_0700_and_every_private_key_0600(tmp_path) -> None:
    out = tmp_path / "keys"
    old = os.umask(0)  # the most permissive umask: modes must not depend on it
    try:
        assert main(["keys", "init", "--org", "acme", "--out", str(out)]) == 0
    finally:
        os.umask(old)
    assert _mode(out) == 0o700 and _mode(out / "ca") == 0o700
    private = [out / "acme.key", out / "acme.signing.key", out / "ca" / "ca.key"]
    for key in private:
        assert _mode(key) == 0o600, key
    assert sorted(out.rglob("*.key")) == sorted(private)


def test_a_pre_created_key_file_is_refused_not_reused(tmp_path, capsys) -> None:
    out = private_dir(tmp_path / "k")
    planted = out / "acme.key"
    planted.write_bytes(b"planted by someone else")
    planted.chmod(0o644)
    assert main(["keys", "init", "--org", "acme", "--out", str(out)]) != 0
    assert "acme.key: already exists; refusing to overwrite a key" in capsys.readouterr().err
    assert planted.read_bytes() == b"planted by someone else"  # never truncated, never reused
    link = out / "x.key"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConfigError):
        write_private(link, b"secret")
    assert not (tmp_path / "elsewhere").exists()


def test_unsafe_key_directories_are_refused(tmp_path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by group or others"):
        private_dir(shared)
    if os.geteuid() == 0:  # only root can hand a directory to another user
        foreign = tmp_path / "foreign"
        foreign.mkdir(mode=0o700)
        os.chown(foreign, 65534, 65534)
        with pytest.raises(ConfigError, match="owned by another user"):
            private_dir(foreign)


def test_state_files_are_0600(tmp_path) -> None:
    old = os.umask(0)
    try:
        conn = connect(tmp_path / "state.sqlite")
        conn.execute("CREATE TABLE t (x)")
        conn.close()
    finally:
        os.umask(old)
    assert _mode(tmp_path / "state.sqlite") == 0o600
