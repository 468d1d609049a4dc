"""Admin bearer tokens: at least 128 bits, read from a file only this user controls.

A token's strength is estimated from its length and the classes of characters it uses (lower
case, upper case, digits, others: 26, 26, 10 and 32 symbols), and it must use at least 10
distinct characters: a random 32-digit hex token (128 bits) passes, ``abc`` or 32 times ``a``
does not. ``secrets.token_urlsafe(32)`` (256 bits) is what ``dpda`` generates.
"""

from __future__ import annotations

import math
from pathlib import Path

from dpda.errors import ConfigError
from dpda.service.keyfiles import check_private

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
