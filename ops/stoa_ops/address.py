"""`host:port` and loopback, one rule for every service's address settings."""

from __future__ import annotations

import ipaddress


def split_host_port(address: str, what: str = "address", example: str = "127.0.0.1:8080") -> tuple[str, int]:
    """Split `host:port` (or `[::1]:port`); `what` names the setting in errors.

    The port must be 0 to 65535; the host is returned without brackets. Whether the host must be an IP
    literal is the caller's rule (see `ip_host_port`).
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{what} {address!r} is not host:port (for example {example})")
    if host.startswith("[") != host.endswith("]"):
        raise ValueError(f"{what} {address!r}: unbalanced brackets around the host")
    host = host.removeprefix("[").removesuffix("]")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"{what} {address!r}: port out of range")
    return host, port


def ip_host_port(
    address: str, what: str = "address", example: str = "127.0.0.1:8080", host_kind: str = "an IP literal"
) -> tuple[str, int]:
    """`split_host_port` whose host must be an IP literal (returned in its canonical form)."""
    host, port = split_host_port(address, what, example)
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{what} {address!r}: the host must be {host_kind}, not {host!r}") from None
    return str(ip), port


def is_loopback(host: str) -> bool:
    """True for `localhost` and for IP literals in 127.0.0.0/8 or ::1; False for anything else."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.removeprefix("[").removesuffix("]")).is_loopback
    except ValueError:
        return False
