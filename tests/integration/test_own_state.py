"""State and keys are the daemon's own: a state folder another user owns or may write (or one
below such a folder), and private key or token files that group or others may read, are
refused at start, naming the path; files in the state folder are written through a fresh
``O_EXCL | O_NOFOLLOW`` temporary at 0600, so a planted symlink is never followed.

The tests run as root (the container's user): ownership is handed to ``nobody`` with
``os.chown``, as another local user would hold it."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest

from dpda.deployment import dpda_command
from dpda.errors import ConfigError
from dpda.service import keyfiles, signed_head, signing
from dpda.service.config import load_source, load_target
from dpda.service.tokens import read_token
from dpda.source_party.app import build
from dpda.target_party.app import open_state
from tests.integration.helpers import synthetic_deployment

NOBODY = 65534
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="only root can hand a file to another user")


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _serve(config: Path) -> subprocess.CompletedProcess[str]:
    """``dpda source serve``: it must exit by itself (a daemon that starts is a failure)."""
    try:
        return subprocess.run(
            dpda_command("source", "serve", "--config", str(config)),
            capture_output=True,
            text=True,
            timeout=90,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("source serve started instead of refusing")


def test_source_serve_exits_naming_a_group_writable_state_dir(tmp_path: Path) -> None:
    dep = synthetic_deployment(tmp_path)
    dep.source_state.mkdir()
    dep.source_state.chmod(0o775)
    got = _serve(dep.source_config)
    assert got.returncode != 0
    assert f"state_dir: {dep.source_state}" in got.stderr
    assert "writable by group or others" in got.stderr
    assert not (dep.source_state / "state.sqlite").exists()


def test_source_serve_exits_naming_a_signing_key_others_can_read(tmp_path: Path) -> None:
    dep = synthetic_deployment(tmp_path)
    dep.source_keys.signing_key.chmod(0o644)
    got = _serve(dep.source_config)
    assert got.returncode != 0
    assert f"signing_key: {dep.source_keys.signing_key}" in got.stderr
    assert "readable by group or others" in got.stderr


@as_root
def test_a_state_dir_another_user_owns_is_refused_by_both_daemons(tmp_path: Path) -> None:
    dep = synthetic_deployment(tmp_path)
    for state in (dep.source_state, dep.target_state):
        state.mkdir(mode=0o700)
        os.chown(state, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=f"state_dir: {dep.source_state}: .*another user"):
        build(load_source(dep.source_config))
    with pytest.raises(ConfigError, match=f"state_dir: {dep.target_state}: .*another user"):
        open_state(load_target(dep.target_config))
    assert not (dep.source_state / "state.sqlite").exists()
    assert not (dep.target_state / "keys.json").exists()


@as_root
def test_a_state_dir_below_a_folder_another_user_owns_is_refused(tmp_path: Path) -> None:
    """The folder above may be swapped by its owner (and the state with it); a symlink to the
    state folder is followed and its real path checked too."""
    above = tmp_path / "above"
    above.mkdir(mode=0o755)
    (above / "state").mkdir(mode=0o700)
    os.chown(above, NOBODY, NOBODY)
    with pytest.raises(ConfigError, match=f"the folder {above} above it is owned by another"):
        keyfiles.state_dir(above / "state")
    link = tmp_path / "link"
    link.symlink_to(above / "state")
    with pytest.raises(ConfigError, match=f"state_dir: {link}: the folder {above} above it"):
        keyfiles.state_dir(link)
    os.chown(above, 0, 0)
    above.chmod(0o777)  # world-writable and not sticky: refused
    with pytest.raises(ConfigError, match="writable by group or others"):
        keyfiles.state_dir(above / "state")
    above.chmod(0o1777)  # sticky and root's, as /tmp: accepted
    assert keyfiles.state_dir(above / "state") == above / "state"


def test_a_missing_state_dir_is_made_0700_and_tmp_is_an_accepted_ancestor(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        made = keyfiles.state_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert _mode(made) == 0o700
    assert stat.S_IMODE(os.stat("/tmp").st_mode) & stat.S_ISVTX  # the standard exception


def test_tls_keys_and_tokens_others_can_read_are_refused_symlinks_resolved(tmp_path: Path) -> None:
    dep = synthetic_deployment(tmp_path)
    dep.target_keys.key.chmod(0o640)
    with pytest.raises(ConfigError, match=f"tls.key: {dep.target_keys.key}: readable by group"):
        open_state(load_target(dep.target_config))
    dep.target_keys.key.chmod(0o600)
    token = tmp_path / "token"
    token.write_text("kQ7vR2xW9mT4pL8sN1bH6cJ3fY5gD0aZ-uE_iO" + "\n")
    token.chmod(0o644)
    with pytest.raises(ConfigError, match="admin.token_file: .*readable by group or others"):
        read_token(token, "admin.token_file")
    token.chmod(0o600)
    assert read_token(token, "admin.token_file")
    # a link to a readable key: the key it leads to is what is checked
    exposed = tmp_path / "exposed.key"
    exposed.write_bytes(dep.source_keys.signing_key.read_bytes())
    exposed.chmod(0o644)
    link = tmp_path / "link.key"
    link.symlink_to(exposed)
    with pytest.raises(ConfigError, match="signing_key: .*readable by group or others"):
        signing.load_private(link)


@as_root
def test_a_symlinked_key_in_a_folder_another_user_owns_is_refused(tmp_path: Path) -> None:
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    dep = synthetic_deployment(tmp_path / "dep")
    key = theirs / "signing.key"
    key.write_bytes(dep.source_keys.signing_key.read_bytes())
    key.chmod(0o600)
    os.chown(theirs, NOBODY, NOBODY)
    link = tmp_path / "mine.key"
    link.symlink_to(key)
    with pytest.raises(ConfigError, match=f"the folder {theirs} above it is owned by another"):
        signing.load_private(link)


def test_a_planted_tmp_symlink_is_not_followed(tmp_path: Path) -> None:
    """``keys.json.tmp`` (and the head's temporary) planted as links to a file of this user:
    the file is left as it was, ``keys.json`` is a regular 0600 file of its own."""
    state = keyfiles.state_dir(tmp_path / "state")
    victim = tmp_path / "victim"
    victim.write_text("precious")
    for name in ("keys.json.tmp", signed_head.FILE + ".tmp", "port.tmp", "admin_port.tmp"):
        (state / name).symlink_to(victim)
    dep = synthetic_deployment(tmp_path / "dep")
    key = signing.load_private(dep.source_keys.signing_key)
    signing.write_role_keys(state, key, {"t": dep.target_keys.signing_pub}, "source")
    signing.write_role_keys(state, key, {"t": dep.target_keys.signing_pub}, "source")  # replace
    keyfiles.write_atomic(state / "port", b"1234")
    assert victim.read_text() == "precious"
    for name in ("keys.json", "port"):
        got = state / name
        assert got.is_file() and not got.is_symlink() and _mode(got) == 0o600
    assert json.loads((state / "keys.json").read_text())["side"] == "source"
    assert not [p for p in state.iterdir() if p.name.endswith(".tmp") and not p.is_symlink()]


def test_the_daemon_writes_its_state_files_0600(tmp_path: Path) -> None:
    dep = synthetic_deployment(tmp_path)
    old = os.umask(0)
    try:
        build(load_source(dep.source_config))
    finally:
        os.umask(old)
    for name in ("state.sqlite", "keys.json"):
        assert _mode(dep.source_state / name) == 0o600, name
    assert _mode(dep.source_state) == 0o700
