"""Requests sent to the gateway exactly as written: no client-side path normalisation (httpx would
resolve `..` first), and, for what no HTTP client will send (a folded header), raw bytes."""

from __future__ import annotations

import http.client
import socket
from collections.abc import Sequence
from urllib.parse import urlsplit


class Reply:
    def __init__(self, status: int, headers: Sequence[tuple[str, str]], body: bytes) -> None:
        self.status = status
        self.headers = {k.lower(): v for k, v in headers}
        self.body = body

    def cors(self) -> dict[str, str]:
        return {k: v for k, v in self.headers.items() if k.startswith("access-control-")}


def send(
    base_url: str,
    method: str,
    target: str,
    headers: Sequence[tuple[str, str]] = (),
    body: bytes | None = None,
) -> Reply:
    """One request with `target` sent byte for byte, on its own connection."""
    parts = urlsplit(base_url)
    conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port or 80, timeout=10)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for name, value in headers:
            conn.putheader(name, value)
        if body is not None:
            conn.putheader("content-length", str(len(body)))
        conn.endheaders(body)
        response = conn.getresponse()
        return Reply(response.status, response.getheaders(), response.read())
    finally:
        conn.close()


def send_bytes(base_url: str, request: bytes) -> Reply:
    """`request` (one complete HTTP/1.1 request asking for `connection: close`) as raw bytes."""
    parts = urlsplit(base_url)
    with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 80), timeout=10) as sock:
        sock.sendall(request)
        response = http.client.HTTPResponse(sock)
        response.begin()
        return Reply(response.status, response.getheaders(), response.read())
