"""The Link's operator endpoint: `/health/live`, `/health/ready` and `/metrics` over plain HTTP.

Ready = a snapshot has been acknowledged by every required client (Envoy, and stoa-authz when
AUTHZ_SAN is set): `AdsServer.publish` only records a snapshot as acknowledged once all of them
ACKed it. Three GET endpoints on a bare asyncio server, like stoa-authz's (a web framework would be
more code than the endpoints; the two services share no package to hold a common responder).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

from stoa_link import metrics
from stoa_link.ads import AdsServer

_MAX_REQUEST_HEAD = 8192
_JSON = "application/json"
_PHRASES = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}

log = logging.getLogger("stoa_link.health")


def readiness(ads: AdsServer) -> dict[str, object]:
    """`{"status": "ready", ...}` or `{"status": "not_ready", "reason": ...}`, with the clients seen."""
    clients = {identity: ads.connected(identity) for identity in ads.identities}
    acked = ads.acked_snapshot
    if acked is not None:
        return {
            "status": "ready",
            "generation": acked.generation,
            "version": acked.version,
            "clients": clients,
        }
    missing = [identity for identity, n in clients.items() if not n]
    reason = (
        f"waiting for ADS clients: {', '.join(missing)}"
        if missing
        else "no snapshot acknowledged by every required client yet"
    )
    return {"status": "not_ready", "reason": reason, "clients": clients}


class HttpEndpoints:
    def __init__(self, ads: AdsServer, families: Callable[[], list[metrics.Family]]) -> None:
        self._ads = ads
        self._families = families

    def answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for one request."""
        if method not in ("GET", "HEAD"):
            return 405, _JSON, b'{"error":"method_not_allowed"}'
        path = path.split("?", 1)[0]
        if path == "/health/live":
            return 200, _JSON, b'{"status":"live"}'
        if path == "/health/ready":
            state = readiness(self._ads)
            return (200 if state["status"] == "ready" else 503), _JSON, json.dumps(state).encode()
        if path == "/metrics":
            return 200, metrics.CONTENT_TYPE, metrics.exposition(self._families()).encode()
        return 404, _JSON, b'{"error":"not_found"}'

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            status, content_type, body = self.answer(method, path)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            method, status, content_type, body = "GET", 400, _JSON, b'{"error":"bad_request"}'
        except Exception:  # a broken scrape must never take the Link down: answer 500 and log it
            log.exception("http_endpoint_error")
            method, status, content_type, body = "GET", 500, _JSON, b'{"error":"internal"}'
        writer.write(
            f"HTTP/1.1 {status} {_PHRASES.get(status, 'Internal Server Error')}\r\n"
            f"content-type: {content_type}\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n".encode()
            + (body if method != "HEAD" else b"")
        )
        try:
            await writer.drain()
        except ConnectionError:
            pass  # the client went away; nothing to tell it
        finally:
            writer.close()

    async def start(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self.handle, host, port, limit=_MAX_REQUEST_HEAD)
