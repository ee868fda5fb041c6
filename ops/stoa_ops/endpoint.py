"""The operator HTTP endpoint every site service runs beside its main port.

- `GET /health/live`: 200 while the process runs;
- `GET /health/ready`: 200 `{"status": "ready", ...}` or 503 `{"status": "not_ready", "reason": ..., ...}`,
  from the service's own readiness function;
- `GET /metrics`: the service's registry in the Prometheus text format, written by prometheus-client;
- any extra read-only document the service names (`/.well-known/jwks.json`, ...).

A few GET endpoints on a bare asyncio server: it runs on the service's own event loop, next to its
gRPC work, with no framework of its own to start, and HEAD, 404, 405 and a garbled request are all
it has to answer besides.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, disable_created_metrics, generate_latest

log = logging.getLogger("stoa_ops.endpoint")

# A `_created` series beside every counter and histogram doubles their series for a timestamp nobody
# reads here (process start is in the service's own logs); one process, one choice.
disable_created_metrics()

JSON = "application/json"
MAX_REQUEST_HEAD = 8192
_PHRASES = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}

# `None` when ready, else why not; the details (clients seen, versions, ...) go into the body either way.
Readiness = Callable[[], tuple[str | None, Mapping[str, object]]]


def exposition(registry: CollectorRegistry) -> bytes:
    """`registry` in the Prometheus text format, as `/metrics` serves it (`CONTENT_TYPE`)."""
    return generate_latest(registry)


CONTENT_TYPE = CONTENT_TYPE_LATEST


class OperatorEndpoint:
    def __init__(
        self,
        readiness: Readiness,
        registry: CollectorRegistry,
        documents: Mapping[str, tuple[str, bytes]] | None = None,
    ) -> None:
        """`documents`: extra paths served as they are, path → (content type, body)."""
        self._readiness = readiness
        self._registry = registry
        self._documents = dict(documents or {})

    def answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        """Status, content type and body for one request."""
        if method not in ("GET", "HEAD"):
            return 405, JSON, b'{"error":"method_not_allowed"}'
        path = path.split("?", 1)[0]
        if path == "/health/live":
            return 200, JSON, b'{"status":"live"}'
        if path == "/health/ready":
            reason, details = self._readiness()
            if reason is None:
                return 200, JSON, json.dumps({"status": "ready", **details}).encode()
            return 503, JSON, json.dumps({"status": "not_ready", "reason": reason, **details}).encode()
        if path == "/metrics":
            return 200, CONTENT_TYPE, exposition(self._registry)
        if path in self._documents:
            content_type, body = self._documents[path]
            return 200, content_type, body
        return 404, JSON, b'{"error":"not_found"}'

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            status, content_type, body = self.answer(method, path)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            method, status, content_type, body = "GET", 400, JSON, b'{"error":"bad_request"}'
        except Exception:  # a broken scrape must never take the service down: answer 500 and log it
            log.exception("operator_endpoint_error")
            method, status, content_type, body = "GET", 500, JSON, b'{"error":"internal"}'
        writer.write(
            f"HTTP/1.1 {status} {_PHRASES[status]}\r\n"
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

    async def start(self, host: str, port: int, reuse_port: bool = False) -> asyncio.Server:
        """Listen on `host:port` (port 0: any free port); several processes may share it with
        `reuse_port`."""
        return await asyncio.start_server(
            self.handle, host, port, reuse_port=reuse_port or None, limit=MAX_REQUEST_HEAD
        )
