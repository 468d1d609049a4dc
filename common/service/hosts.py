"""Host names as the admin API's checks read them (a ``Host`` header, a listen address) and as
the config checks where the API may listen."""

from __future__ import annotations

import ipaddress

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")
WILDCARDS = ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_host(host: str) -> tuple[str, int | None] | None:
    """``name[:port]`` of a Host header (IPv6 bracketed) → (lower-case name, port or None)."""
    host = host.strip().lower()
    if host.startswith("["):
        name, sep, rest = host.partition("]")
        name += sep
        if rest and not rest.startswith(":"):
            return None
        port = rest[1:] if rest else None
    else:
        name, sep, port_s = host.partition(":")
        port = port_s if sep else None
    if not name or name == "[]":
        return None
    if port is None:
        return name, None
    if not port.isdigit() or len(port) > 5:
        return None
    return name, int(port)


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True
