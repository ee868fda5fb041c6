"""An ASGI application served by uvicorn on its own thread, on a socket bound before start.

Binding first (port 0 by default) means the port is known and held before the server runs, so
there is no window in which another process could take it. The in-process servers of the harness
(echo upstream, scripted CP, dev identity provider) all run on this.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import uvicorn

from stoa_harness.lifecycle import Lifecycle
from stoa_harness.wait import wait_until

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


async def read_body(receive: Receive) -> bytes:
    """The whole request body, however many messages it came in."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


class ThreadedASGIServer(Lifecycle):
    def __init__(
        self, app: ASGIApp, name: str, host: str = "127.0.0.1", port: int = 0, start_timeout: float = 10.0
    ) -> None:
        self.app = app
        self.name = name
        self.host = host
        self.port = port
        self.start_timeout = start_timeout
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._sock: socket.socket | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _start(self) -> None:
        # IPPROTO_TCP named explicitly: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose
        # `proto` says TCP, and a socket made with proto 0 would hold each response's second write
        # until the client's delayed ACK (~40 ms per keep-alive request).
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        self._sock = sock
        config = uvicorn.Config(
            self.app,
            interface="asgi3",
            lifespan="off",
            log_level="warning",
            access_log=False,
            proxy_headers=False,  # record what the peer sent, never rewrite it from forwarded headers
            timeout_keep_alive=30,
            timeout_graceful_shutdown=2,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name=self.name, daemon=True
        )
        self._thread.start()
        wait_until(lambda: server.started, self.start_timeout, f"{self.name} started")

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._sock is not None:
            self._sock.close()
        self._server = self._thread = self._sock = None


class ServedByThread(Lifecycle):
    """A fake service the harness runs on one `ThreadedASGIServer` (`self._http`): started and stopped
    with it, reached at its port and URL."""

    _http: ThreadedASGIServer

    def _start(self) -> None:
        self._http.start()

    def stop(self) -> None:
        self._http.stop()

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        return self._http.url
