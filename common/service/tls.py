"""Certificates for mTLS (``dpda keys init``), pinning by fingerprint, gRPC credentials."""

from __future__ import annotations

import datetime as dt
import hashlib
import hmac
import ipaddress
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from dpda.errors import ConfigError, DpdaError, PeerMisbehaved
from dpda.service import signing
from dpda.service.backoff import backoff
from dpda.service.keyfiles import check_private, check_trusted, private_dir, write_private

log = logging.getLogger("dpda.tls")


def fingerprint(cert_pem: bytes) -> str:
    """``sha256:<hex>`` of the certificate's DER encoding: the identity peers are pinned by."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    return "sha256:" + hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    write_private(
        path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def make_ca(out: Path, cn: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=825))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(key, hashes.SHA256())
    )
    private_dir(out)
    (out / "ca.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, out / "ca.key")
    return out / "ca.pem", out / "ca.key"


@dataclass(frozen=True)
class PartyKeys:
    cert: Path
    key: Path
    ca: Path
    signing_key: Path
    signing_pub: Path
    fingerprint: str


def _inside_git_checkout(path: Path) -> bool:
    p = path.resolve()
    for parent in (p, *p.parents):
        if (parent / ".git").exists():
            return True
    return False


def init_party(
    out: Path, org: str, ca_dir: Path | None = None, hosts: tuple[str, ...] = ("localhost",)
) -> PartyKeys:
    """Write a CA-signed TLS key pair and an Ed25519 signing key for ``org`` under ``out``.

    Without ``ca_dir`` a new CA is made in ``out/ca``. Refuses to write inside a git checkout:
    no key is ever committed.
    """
    if _inside_git_checkout(out):
        raise ConfigError(f"--out {out}: refusing to write keys inside a git checkout")
    private_dir(out)
    if ca_dir is None:
        ca_pem, ca_key_path = make_ca(out / "ca", f"{org} CA")
    else:
        ca_pem, ca_key_path = ca_dir / "ca.pem", ca_dir / "ca.key"
    ca_cert = x509.load_pem_x509_certificate(ca_pem.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in (*hosts, "127.0.0.1"):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(org))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=397))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    (out / f"{org}.pem").write_bytes(cert_pem)
    _write_key(key, out / f"{org}.key")
    skey = signing.new_key()
    signing.save_key(skey, out / f"{org}.signing.key", out / f"{org}.signing.pub")
    return PartyKeys(
        cert=out / f"{org}.pem",
        key=out / f"{org}.key",
        ca=ca_pem,
        signing_key=out / f"{org}.signing.key",
        signing_pub=out / f"{org}.signing.pub",
        fingerprint=fingerprint(cert_pem),
    )


def read_config_file(path: Path, field: str) -> bytes:
    """A file a config names, or a ``ConfigError`` naming the field behind it."""
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{field}: {path}: no such file") from None
    except OSError as exc:
        raise ConfigError(f"{field}: {path}: {exc.strerror or exc}") from None


def tls_files(cert: Path, key: Path, ca: Path) -> tuple[bytes, bytes, bytes]:
    """(certificate, key, CA) as PEM bytes, each named by its ``[tls]`` field when missing or
    unreadable, and the key checked against the certificate: a key of another certificate fails
    here, by name, not inside the TLS library."""
    cert_pem = read_config_file(cert, "tls.cert")
    key_pem = read_config_file(key, "tls.key")
    ca_pem = read_config_file(ca, "tls.peer_ca")
    try:
        public = x509.load_pem_x509_certificate(cert_pem).public_key()
    except ValueError:
        raise ConfigError(f"tls.cert: {cert}: not a PEM certificate") from None
    try:
        private = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"tls.key: {key}: not an unencrypted PEM private key") from None
    der = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(*der) != public.public_bytes(*der):
        raise ConfigError(
            f"tls.key: {key} is not the key of the certificate tls.cert ({cert}); use the key "
            "made with that certificate (`dpda keys init` writes them side by side)"
        )
    return cert_pem, key_pem, ca_pem


def server_credentials(cert: Path, key: Path, client_ca: Path) -> grpc.ServerCredentials:
    for p in (cert, client_ca):
        check_trusted(p)
    check_private(key, "tls.key")
    cert_pem, key_pem, ca_pem = tls_files(cert, key, client_ca)
    return grpc.ssl_server_credentials(
        [(key_pem, cert_pem)], root_certificates=ca_pem, require_client_auth=True
    )


def channel_credentials(cert: Path, key: Path, server_ca: Path) -> grpc.ChannelCredentials:
    for p in (cert, server_ca):
        check_trusted(p)
    check_private(key, "tls.key")
    cert_pem, key_pem, ca_pem = tls_files(cert, key, server_ca)
    return grpc.ssl_channel_credentials(
        root_certificates=ca_pem, private_key=key_pem, certificate_chain=cert_pem
    )


# TLS alerts by which a server refuses the client's certificate (OpenSSL's reason names)
_REFUSED_ALERTS = (
    "UNKNOWN_CA",
    "BAD_CERTIFICATE",
    "CERTIFICATE_UNKNOWN",
    "CERTIFICATE_REQUIRED",
    "UNSUPPORTED_CERTIFICATE",
    "CERTIFICATE_EXPIRED",
    "CERTIFICATE_REVOKED",
    "ACCESS_DENIED",
)


def _refused_by_server(exc: ssl.SSLError, address: str, cert: Path) -> ConfigError | None:
    """A ``ConfigError`` when ``exc`` is the server's alert refusing our certificate."""
    reason = str(exc.reason or exc)
    if not any(a in reason.upper() for a in _REFUSED_ALERTS):
        return None
    return _refused(address, cert, f"TLS alert {reason}")


def _refused(address: str, cert: Path, how: str) -> ConfigError:
    return ConfigError(
        f"tls.cert: the source {address} refused this target's certificate ({cert}; {how}): "
        "the source's tls.peer_ca must be the CA that signed it; nothing was sent"
    )


def peer_fingerprint(context: grpc.ServicerContext) -> str | None:
    """Fingerprint of the authenticated client certificate, or None."""
    certs = context.auth_context().get("x509_pem_cert")
    if not certs:
        return None
    return fingerprint(certs[0])


def grpc_host_port(address: str) -> tuple[str, int]:
    """(host, port) of a gRPC target — ``host:port``, ``[v6]:port``, ``dns:///host:port``,
    ``dns://authority/host:port``, ``ipv4:a.b.c.d:port`` or ``ipv6:[v6]:port`` — with the host as
    gRPC verifies the server certificate against it (the target's host; port 443 if none)."""
    rest = address.strip()
    if rest.startswith("dns:"):
        rest = rest[4:]
        if rest.startswith("//"):
            rest = rest[2:].split("/", 1)[1] if "/" in rest[2:] else ""
    elif rest.startswith(("ipv4:", "ipv6:")):
        rest = rest[5:].split(",", 1)[0]
    elif rest.startswith(("unix:", "unix-abstract:", "vsock:")):
        raise ConfigError(
            f"source_address: {address}: the source's certificate is checked over TCP; use "
            "host:port"
        )
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port_s = tail[1:] if tail.startswith(":") else ""
    elif rest.count(":") == 1:
        host, _, port_s = rest.partition(":")
    else:
        host, port_s = rest, ""  # a bare host (or a bare IPv6 address)
    if not host or (port_s and not port_s.isdigit()):
        raise ConfigError(f"source_address: {address}: not host:port")
    return host, int(port_s) if port_s else 443


def check_server_fingerprint(
    address: str,
    cert: Path,
    key: Path,
    ca: Path,
    expected: str,
    timeout: float = 10.0,
    retry_s: float = 0.0,
) -> str:
    """Pin the server before anything is sent to it: a TLS handshake (our client certificate,
    ``ca`` as the only trust root, the host name checked as gRPC checks it) that reads the
    server's certificate and compares its fingerprint with ``expected``. No application byte is
    sent. Raises ``PeerMisbehaved`` when the certificate does not verify or is another one than
    the pinned (any certificate the CA signed would otherwise pass mTLS); retries an unreachable
    server with backoff for ``retry_s`` seconds, then raises ``DpdaError``. Returns the
    fingerprint."""
    host, port = grpc_host_port(address)
    tls_files(cert, key, ca)  # each file by its field, and the key against the certificate
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_verify_locations(cafile=str(ca))
    ctx.load_cert_chain(str(cert), str(key))
    ctx.set_alpn_protocols(["h2"])  # as gRPC offers; its server refuses a handshake without
    deadline = time.monotonic() + retry_s
    delays = backoff()
    while True:
        try:
            with (
                socket.create_connection((host, port), timeout=timeout) as sock,
                ctx.wrap_socket(sock, server_hostname=host) as tls,
            ):
                der = tls.getpeercert(binary_form=True)
                # under TLS 1.3 the server judges our certificate after the handshake: its first
                # bytes (HTTP/2 settings) or its alert tell whether it accepted it
                tls.settimeout(min(timeout, 5.0))
                try:
                    first = tls.recv(1)
                except TimeoutError:
                    first = None  # no word yet: gRPC's own handshake will tell
            if first == b"":  # closed at once, with no HTTP/2 settings: our certificate refused
                raise _refused(address, cert, "the connection closed after the handshake")
            break
        except ssl.SSLCertVerificationError as exc:
            raise PeerMisbehaved(
                f"source {address}: its certificate does not verify against {ca} "
                f"({exc.verify_message}); nothing was sent"
            ) from None
        except ssl.SSLError as exc:
            refused = _refused_by_server(exc, address, cert)
            if refused is not None:
                raise refused from None  # a setting, not an outage: no retry helps
            delay = next(delays)
            if time.monotonic() + delay > deadline:
                raise DpdaError(
                    f"source error: {address} unavailable for the certificate check ({exc})"
                ) from None
            log.warning("source %s unavailable (%s); retrying in %.1f s", address, exc, delay)
            time.sleep(delay)
        except OSError as exc:  # refused, reset, timed out, a failed handshake: unavailable
            delay = next(delays)
            if time.monotonic() + delay > deadline:
                raise DpdaError(
                    f"source error: {address} unavailable for the certificate check ({exc})"
                ) from None
            log.warning("source %s unavailable (%s); retrying in %.1f s", address, exc, delay)
            time.sleep(delay)
    if not der:
        raise PeerMisbehaved(f"source {address}: presented no certificate; nothing was sent")
    got = fingerprint(ssl.DER_cert_to_PEM_cert(der).encode())
    if not hmac.compare_digest(got, expected):
        raise PeerMisbehaved(
            f"source {address}: its certificate {got} is not the pinned source_fingerprint "
            f"{expected}; refusing to send it anything"
        )
    return got
