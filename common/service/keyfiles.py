"""Private files on disk: keys and state, created private from the first byte.

The old code wrote keys with ``write_bytes`` (mode 0666 masked by the umask, O_TRUNC on an
existing file) and ``chmod``-ed afterwards: a file another user had pre-created stayed readable
by that user, and a fresh key was world-readable until the chmod. Here:

* ``private_dir(path)`` creates the directory with mode 0700, or accepts an existing one only if
  this user owns it and no other user can write into it (then it is set to 0700);
* ``write_private(path, data)`` creates the file with ``O_CREAT | O_EXCL`` and mode 0600 in the
  same system call: it never follows a pre-created file or symlink and never overwrites a key;
* ``restrict(path)`` sets an existing state file (SQLite database, WAL, shared memory) to 0600;
* ``state_dir(path)`` is checked before a daemon opens its state: the folder and every folder
  above it (on the path as given and on its real path) belong to this user or root and no one
  else may write to them, else another user could delete or swap the ledger, the countersigned
  head and ``keys.json``; a missing state folder is created 0700;
* ``write_atomic(path, data)`` replaces a file in the state folder: a temporary file of a fresh
  name created ``O_CREAT | O_EXCL | O_NOFOLLOW`` at 0600 (a planted file or symlink is never
  opened), fsynced, renamed over ``path`` (the rename replaces a link, never follows it);
* ``check_private(path, field)`` is ``check_trusted`` plus: a private key or token that group
  or others may read is refused, since reading it is enough to use it;
* ``check_trusted(path)`` is checked before a key, certificate or token is read, as OpenSSH
  checks ``authorized_keys``: the file and every folder above it, up to the root (along the
  path as given and along the path its links lead to), belong to this user or root and no one
  else may write to them — a user who owns or may write to a folder above a key could swap the
  key. One departure: a root-owned folder with the sticky bit (``/tmp``) is accepted, since no
  other user may rename or remove what it holds.
"""

from __future__ import annotations

import os
import secrets
import stat
from pathlib import Path

from dpda.errors import ConfigError


def private_dir(path: Path) -> Path:
    """``path`` as a directory only this user can enter (0700); refuses unsafe existing ones."""
    try:
        path.mkdir(mode=0o700, parents=True)
    except FileExistsError:
        st = path.lstat()
        if not stat.S_ISDIR(st.st_mode):
            raise ConfigError(f"{path}: exists and is not a directory") from None
        if st.st_uid != os.geteuid():
            raise ConfigError(
                f"{path}: owned by another user; refusing to put keys there"
            ) from None
        if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            raise ConfigError(
                f"{path}: writable by group or others; refusing to put keys there"
            ) from None
    path.chmod(0o700)
    return path


def write_private(path: Path, data: bytes) -> Path:
    """Create ``path`` with mode 0600 and write ``data``; an existing file is an error."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        raise ConfigError(f"{path}: already exists; refusing to overwrite a key") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return path


def restrict(path: Path) -> None:
    """Mode 0600 on an existing state file (and its SQLite -wal / -shm companions)."""
    for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if p.exists():
            p.chmod(0o600)


def _unsafe(st: os.stat_result) -> str | None:
    uid = os.geteuid()
    if st.st_uid not in (0, uid):
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        if stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and st.st_uid == 0:
            return None
        return "writable by group or others"
    return None


def check_trusted(path: str | Path, field: str = "") -> None:
    """Raise ``ConfigError`` (naming ``field`` when given) unless ``path`` and every folder
    above it belong to this user or root and no one else may write to them."""
    given = Path(os.path.abspath(path))
    real = Path(os.path.realpath(path))
    where = f"{field}: {path}" if field else str(path)
    checked: set[Path] = set()
    for p in (real, *real.parents, *given.parents):
        if p in checked:
            continue
        checked.add(p)
        why = _unsafe(os.stat(p))
        if why is not None:
            what = "the file" if p == real else f"the folder {p} above it"
            raise ConfigError(f"{where}: {what} is {why}; refusing to load it")


def check_private(path: str | Path, field: str = "") -> None:
    """``check_trusted``, and the file (its real path) is not readable by group or others."""
    check_trusted(path, field)
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        where = f"{field}: {path}" if field else str(path)
        raise ConfigError(
            f"{where}: readable by group or others (mode {stat.S_IMODE(mode):o}); a private "
            "key or token must be mode 0600 (chmod 600 it); refusing to load it"
        )


def state_dir(path: Path, field: str = "state_dir") -> Path:
    """``path`` as the daemon's state folder: created 0700 (and each missing folder above it)
    when missing; refused (naming
    ``field`` and the folder) when it, or any folder above it on the path as given or on
    its real path, belongs to another user or may be written by group or others (a
    root-owned sticky folder such as ``/tmp`` excepted)."""
    given = Path(os.path.abspath(path))
    for p in (*reversed(given.parents), given):  # each missing folder made 0700, not umask's
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass
    real = Path(os.path.realpath(path))
    if not real.is_dir():
        raise ConfigError(f"{field}: {path}: exists and is not a directory")
    checked: set[Path] = set()
    for p in (real, *real.parents, given, *given.parents):
        if p in checked:
            continue
        checked.add(p)
        why = _unsafe(os.stat(p))
        if why is not None:
            what = "the folder" if p in (real, given) else f"the folder {p} above it"
            raise ConfigError(
                f"{field}: {path}: {what} is {why}; another user could delete or replace "
                "the ledger and keys there; refusing to use it"
            )
    return path


def write_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a fresh 0600 temporary file (``O_EXCL | O_NOFOLLOW``),
    fsynced, renamed over ``path``, the folder fsynced."""
    tmp = path.with_name(f"{path.name}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
