"""The demo/echo upstream: answers every request with JSON {method, path, query, headers, body}
and records each arrival, so a test can prove what reached the upstream and when.

It runs in-process (uvicorn on its own thread) on a socket bound to 127.0.0.1 port 0. The record
keeps the latest `max_arrivals` requests only, so an estate can serve traffic for days at a steady
footprint (`make run`); a test that looks at more requests than that sets a larger bound.

    with EchoUpstream() as up:
        up.url                        # http://127.0.0.1:<port>
        up.arrivals()                 # [Arrival(at=<monotonic>, method, path, query, headers, body)]
        up.reply_with(status=503)     # script the answer (the JSON echo stays the body by default)
        up.clear()                    # forget arrivals and the scripted answer
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field

from stoa_harness.asgi_thread import Receive, Scope, Send, ServedByThread, ThreadedASGIServer, read_body
from stoa_harness.wait import wait_until


@dataclass(frozen=True)
class Arrival:
    """One request as the upstream received it. `path` is the raw request path (not percent-decoded)."""

    at: float  # time.monotonic() when the request head arrived
    method: str
    path: str
    query: str
    headers: Mapping[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes

    def header(self, name: str) -> str | None:
        return self.headers.get(name.lower())


@dataclass
class _Reply:
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes | None = None  # None: the JSON echo


def _headers(raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
    out: dict[str, str] = {}
    for name, value in raw:
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        out[key] = f"{out[key]}, {val}" if key in out else val
    return out


DEFAULT_MAX_ARRIVALS = 10_000


class EchoUpstream(ServedByThread):
    def __init__(
        self, host: str = "127.0.0.1", port: int = 0, max_arrivals: int = DEFAULT_MAX_ARRIVALS
    ) -> None:
        self.host = host
        self._lock = threading.Lock()
        self._arrivals: deque[Arrival] = deque(maxlen=max_arrivals)
        self._reply = _Reply()
        self._http = ThreadedASGIServer(self._app, "echo-upstream", host, port)

    # -- what tests read and script ---------------------------------------------------------------
    def arrivals(self, path_prefix: str | None = None) -> list[Arrival]:
        """The recorded arrivals (the latest `max_arrivals`), oldest first (optionally only those whose
        path starts with `path_prefix`)."""
        with self._lock:
            items = list(self._arrivals)
        return [a for a in items if path_prefix is None or a.path.startswith(path_prefix)]

    def clear(self) -> None:
        with self._lock:
            self._arrivals.clear()
            self._reply = _Reply()

    def reply_with(
        self, status: int = 200, headers: Mapping[str, str] | None = None, body: bytes | None = None
    ) -> None:
        """Answer every following request with this status/headers (and body; default: the JSON echo)."""
        with self._lock:
            self._reply = _Reply(status, dict(headers or {}), body)

    def wait_arrivals(
        self, count: int, timeout: float = 5.0, path_prefix: str | None = None
    ) -> list[Arrival]:
        return wait_until(
            lambda: (items := self.arrivals(path_prefix)) and len(items) >= count and items,
            timeout,
            f"{count} arrival(s) at the echo upstream",
        )

    # -- the ASGI application ---------------------------------------------------------------------
    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        at = time.monotonic()
        body = await read_body(receive)
        raw_path = scope.get("raw_path") or scope["path"].encode()
        arrival = Arrival(
            at=at,
            method=scope["method"],
            path=raw_path.decode("latin-1"),
            query=scope.get("query_string", b"").decode("latin-1"),
            headers=_headers(scope["headers"]),
            body=body,
        )
        with self._lock:
            self._arrivals.append(arrival)
            reply = self._reply
        payload = reply.body
        if payload is None:
            payload = json.dumps(
                {
                    "method": arrival.method,
                    "path": arrival.path,
                    "query": arrival.query,
                    "headers": dict(arrival.headers),
                    "body": body.decode("utf-8", errors="replace"),
                }
            ).encode()
        headers = {"content-type": "application/json", **reply.headers, "content-length": str(len(payload))}
        await send(
            {
                "type": "http.response.start",
                "status": reply.status,
                "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
            }
        )
        await send({"type": "http.response.body", "body": payload})
