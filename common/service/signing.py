"""Ed25519 signatures over ledger entries and session terms (``cryptography``)."""

from __future__ import annotations

import base64
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from dpda.errors import ConfigError
from dpda.service.keyfiles import check_private, check_trusted, write_atomic


def new_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def save_key(key: Ed25519PrivateKey, private_path: Path, public_path: Path) -> None:
    """The private key created 0600 (``O_EXCL``: never overwrites), the public key beside it."""
    from dpda.service.keyfiles import write_private

    write_private(
        private_path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )
    public_path.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _read(path: str | Path, field: str, private: bool = False) -> bytes:
    try:
        (check_private if private else check_trusted)(path, field)
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{field}: {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{field}: {path}: {exc.strerror or exc}") from None


def load_private(path: str | Path, field: str = "signing_key") -> Ed25519PrivateKey:
    """The Ed25519 signing key at ``path``; ``field``: the config setting that names it."""
    key = serialization.load_pem_private_key(_read(path, field, private=True), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"{path}: not an Ed25519 private key")
    return key


def load_public(path: str | Path, field: str = "signing_public_key") -> Ed25519PublicKey:
    """The Ed25519 public key at ``path``; ``field``: the config setting that names it."""
    key = serialization.load_pem_public_key(_read(path, field))
    if not isinstance(key, Ed25519PublicKey):
        raise ValueError(f"{path}: not an Ed25519 public key")
    return key


def sign(key: Ed25519PrivateKey, message: bytes) -> str:
    return base64.b64encode(key.sign(message)).decode()


def verify(key: Ed25519PublicKey, message: bytes, signature: str) -> bool:
    try:
        key.verify(base64.b64decode(signature.encode(), validate=True), message)
        return True
    except (InvalidSignature, ValueError):
        return False


def write_role_keys(
    state_dir: Path, own: Ed25519PrivateKey, peers: dict[str, Path], side: str
) -> None:
    """``state_dir/keys.json``: the public signing keys by role (this side's own, and each
    peer's by name), so that ``dpda ledger verify`` and ``dpda audit verify`` check every
    signature against its role's key. Written by the daemon at start."""
    import json

    pem = own.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    data = {
        "side": side,
        "self": pem.decode(),
        "peers": {n: Path(p).read_text() for n, p in peers.items()},
    }
    write_atomic(state_dir / "keys.json", json.dumps(data, indent=2).encode())
