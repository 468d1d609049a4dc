"""Admin bearer tokens: at least 128 bits, read from a file only this user controls.

A token's strength is estimated from its length and the classes of characters it uses (lower
case, upper case, digits, others: 26, 26, 10 and 32 symbols), and it must use at least 10
distinct characters: a random 32-digit hex token (128 bits) passes, ``abc`` or 32 times ``a``
does not. ``secrets.token_urlsafe(32)`` (256 bits) is what ``dpda`` generates.
"""

from __future__ import annotations

import math
import os
import secrets
import stat
from pathlib import Path

from dpda.errors import ConfigError
from dpda.service.keyfiles import check_private, check_trusted, write_private

TOKEN_FILE = "admin_token"  # under state_dir: the token a daemon generates for itself

MIN_BITS = 128
MIN_DISTINCT = 10


def estimated_bits(token: str) -> float:
    alphabet = 0
    alphabet += 26 if any(c.islower() for c in token) else 0
    alphabet += 26 if any(c.isupper() for c in token) else 0
    alphabet += 10 if any(c.isdigit() for c in token) else 0
    alphabet += 32 if any(not c.isalnum() for c in token) else 0
    return len(token) * math.log2(alphabet) if alphabet > 1 else 0.0


def check_token(token: str, field: str) -> str:
    """``token`` if strong enough, else ``ConfigError`` naming ``field`` (never the token)."""
    if estimated_bits(token) < MIN_BITS or len(set(token)) < MIN_DISTINCT:
        raise ConfigError(
            f"{field}: the admin token is too weak (at least {MIN_BITS} random bits, e.g. "
            "python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )
    return token


def read_token(path: Path, field: str) -> str:
    """The token in ``path`` (checked like a key file, then for strength)."""
    check_private(path, field)
    token = path.read_text().strip()
    if not token:
        raise ConfigError(f"{field}: {path} is empty")
    return check_token(token, field)


def daemon_token(state_dir: Path, token_file: Path | None) -> tuple[str, Path, bool]:
    """(token, where it is, whether it was generated): the configured ``token_file`` (field
    ``admin.token_file``), else ``state_dir/admin_token`` — created 0600 (``O_EXCL``) with 32
    random bytes at the first start, reused only if it is a regular file of this user that no
    one else may read or write."""
    if token_file is not None:
        return read_token(token_file, "admin.token_file"), token_file, False
    path = state_dir / TOKEN_FILE
    try:
        st = path.lstat()
    except FileNotFoundError:
        token = secrets.token_urlsafe(32)
        write_private(path, (token + "\n").encode())
        return token, path, True
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"{path}: not a regular file; refusing to use it as the admin token")
    if st.st_uid != os.geteuid():
        raise ConfigError(f"{path}: owned by another user; refusing to use it as the admin token")
    if st.st_mode & 0o077:
        raise ConfigError(
            f"{path}: readable or writable by group or others (mode {st.st_mode & 0o777:o}); "
            "refusing to use it as the admin token — remove it and restart to get a new one"
        )
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        token = f.read(4096).decode("utf-8", "replace").strip()
    check_trusted(path, str(path))
    return check_token(token, f"{path} (remove it and restart for a new one)"), path, False
