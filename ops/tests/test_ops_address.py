"""`host:port` and loopback: the one rule every service's address settings go through."""

from __future__ import annotations

import pytest
from stoa_ops.address import ip_host_port, is_loopback, split_host_port


@pytest.mark.parametrize(
    ("address", "expected"),
    [
        ("127.0.0.1:9191", ("127.0.0.1", 9191)),
        ("[::1]:0", ("::1", 0)),
        ("ads.internal:18000", ("ads.internal", 18000)),
        ("0.0.0.0:65535", ("0.0.0.0", 65535)),
    ],
)
def test_split_host_port(address: str, expected: tuple[str, int]) -> None:
    assert split_host_port(address) == expected


@pytest.mark.parametrize(
    "address", ["127.0.0.1", ":80", "host:", "host:http", "h:65536", "[::1:80", "::1]:80"]
)
def test_not_host_port_is_refused_naming_the_setting(address: str) -> None:
    with pytest.raises(ValueError, match="GRPC address"):
        split_host_port(address, "GRPC address")


def test_ip_host_port_wants_an_ip_literal_in_canonical_form() -> None:
    assert ip_host_port("[0:0:0:0:0:0:0:1]:80") == ("::1", 80)
    with pytest.raises(ValueError, match="must be an IP literal, not 'localhost'"):
        ip_host_port("localhost:80")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("LOCALHOST", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("::", False),
        ("localhost.example.com", False),
        ("", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback
