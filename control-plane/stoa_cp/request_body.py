"""The request body on its way in: bounded (a body over its limit is refused with 413 naming the limit,
never read whole: the declared Content-Length is checked first, then the bytes as they arrive), and,
once read, the one place that can tell whether the client still waits for the answer."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from contextvars import ContextVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stoa_cp.problems import Problem


class _AfterBody:
    """The server's receive channel once the body was read whole: the only message left to come is
    the disconnect. A poll that sees it keeps it, so the application still receives it."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.gone = False

    async def poll(self) -> bool:
        if not self.gone:
            try:
                message = await asyncio.wait_for(self._receive(), timeout=0.001)
            except TimeoutError:
                return False
            self.gone = message["type"] == "http.disconnect"
        return self.gone

    async def receive(self) -> Message:
        if self.gone:
            return {"type": "http.disconnect"}
        message = await self._receive()
        self.gone = message["type"] == "http.disconnect"
        return message


_after_body: ContextVar[_AfterBody | None] = ContextVar("stoa_cp_after_body", default=None)


async def client_gone() -> bool:
    """Whether the client of the current request closed its connection (False outside a request)."""
    channel = _after_body.get()
    return channel is not None and await channel.poll()


def too_large(limit: int, setting: str) -> Problem:
    return Problem(413, "Payload too large", [("body", f"exceeds {limit} bytes ({setting})")])


class BodyLimit:
    """ASGI middleware: `default` bytes for every request, or the limit of the first matching path.
    The body is read here, so `client_gone()` can be asked from anywhere in the request's handling."""

    def __init__(
        self, app: ASGIApp, default: tuple[int, str], larger: Sequence[tuple[str, int, str]]
    ) -> None:
        self.app = app
        self.default = default
        self.larger = [(re.compile(pattern), limit, setting) for pattern, limit, setting in larger]

    def _limit(self, path: str) -> tuple[int, str]:
        for pattern, limit, setting in self.larger:
            if pattern.fullmatch(path):
                return limit, setting
        return self.default

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = self._limit(scope["path"])
        for name, value in scope["headers"]:
            if name == b"content-length" and value.isdigit() and int(value) > limit:
                response = too_large(limit, setting).response()
                await response(scope, receive, send)
                return
        # The body is read here, up to the limit: the app only ever sees a body within it.
        messages: list[Message] = []
        received = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            received += len(message.get("body", b""))
            if received > limit:
                await too_large(limit, setting).response()(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        buffered = iter(messages)
        after = _AfterBody(receive)
        if messages[-1]["type"] == "http.request":
            _after_body.set(after)

        async def replay() -> Message:
            return next(buffered, None) or await after.receive()

        await self.app(scope, replay, send)
