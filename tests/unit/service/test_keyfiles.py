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


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can hand a folder to another user")
def test_a_key_below_a_folder_another_user_owns_is_refused(tmp_path) -> None:
    """A user who owns a folder above a key file can swap the key: refused (as OpenSSH refuses
    such an authorized_keys), for signing keys and TLS files, naming the folder."""
    from dpda.service import signing
    from dpda.service.tls import channel_credentials, init_party

    above = tmp_path / "above"
    above.mkdir(mode=0o755)
    party = init_party(above / "keys", "target")
    signing.load_private(party.signing_key)  # fine while this user owns every folder
    os.chown(above, 65534, 65534)
    for load in (
        lambda: signing.load_private(party.signing_key),
        lambda: signing.load_public(party.signing_pub),
        lambda: channel_credentials(party.cert, party.key, party.ca),
    ):
        with pytest.raises(ConfigError, match=f"the folder {above} above it is owned by another"):
            load()
    os.chown(above, 0, 0)
    above.chmod(0o775)  # group-writable: anyone in the group could swap the key as well
    with pytest.raises(ConfigError, match="writable by group or others"):
        signing.load_private(party.signing_key)
