"""Calling a tool's API: at most once (no retry even when a kept-alive connection turns out closed),
within its timeout, and the answer bounded."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable

import pytest
from stoa_mcp.call import MAX_RESPONSE_BYTES, invoke, upstream_session
from stoa_mcp.registry import CompiledTool, compile_policy_set
from stoa_proto import mcp_pb2

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}
OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


class Upstream:
    """A raw HTTP/1.1 server: counts the requests it reads, answers each as `answer` says."""

    def __init__(self, answer: Callable[[int], bytes | None], delay_s: float = 0.0) -> None:
        self.requests: list[str] = []
        self._answer = answer
        self._delay_s = delay_s
        self.port = 0

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            self.requests.append(head.split(b"\r\n", 1)[0].decode())
            await asyncio.sleep(self._delay_s)
            reply = self._answer(len(self.requests))
            if reply is None:  # close the kept-alive connection without an answer
                writer.close()
                return
            writer.write(reply)
            await writer.drain()


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., asyncio.Future[Upstream]]]:
    servers: list[asyncio.Server] = []

    async def start(answer: Callable[[int], bytes | None], delay_s: float = 0.0) -> Upstream:
        upstream = Upstream(answer, delay_s)

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
                await upstream._serve(reader, writer)

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        servers.append(server)
        upstream.port = server.sockets[0].getsockname()[1]
        return upstream

    yield start  # type: ignore[misc]
    for server in servers:
        server.close()


def tool(port: int, method: str = "GET", timeout_ms: int = 0) -> CompiledTool:
    registry = compile_policy_set(
        mcp_pb2.McpPolicySet(
            tools=[
                mcp_pb2.Tool(
                    tenant_id="t",
                    name="get_order",
                    description="Read an order",
                    input_schema_json=json.dumps(SCHEMA),
                    api_id="orders",
                    method=method,
                    path_template="/orders/{id}",
                    upstream_url=f"http://127.0.0.1:{port}",
                    timeout_ms=timeout_ms,
                )
            ]
        )
    )
    return registry.tools[("t", "get_order")]


@pytest.mark.parametrize("method", ["GET", "DELETE"])
async def test_a_call_is_never_sent_twice(serve, method: str) -> None:
    """The second call finds its kept-alive connection closed by the API: an error result, and the API
    read that request once (aiohttp would otherwise send an idempotent request again)."""
    upstream = await serve(lambda n: OK if n == 1 else None)
    session = upstream_session()
    try:
        first = await invoke(session, tool(upstream.port, method), {"id": "1"}, "envelope", 5000)
        assert not first.is_error, first
        second = await invoke(session, tool(upstream.port, method), {"id": "2"}, "envelope", 5000)
    finally:
        await session.close()
    assert second.is_error
    assert second.content[0].text == "the API could not be reached"
    assert upstream.requests == [f"{method} /orders/1 HTTP/1.1", f"{method} /orders/2 HTTP/1.1"]


async def test_the_api_timeout_bounds_a_call(serve) -> None:
    upstream = await serve(lambda n: OK, delay_s=2.0)
    session = upstream_session()
    try:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await invoke(session, tool(upstream.port, timeout_ms=200), {"id": "1"}, "e", 5000)
        elapsed = loop.time() - started
    finally:
        await session.close()
    assert result.is_error
    assert result.content[0].text == "the API did not answer within 0.2 s"
    assert elapsed < 1.5
    assert len(upstream.requests) == 1


async def test_a_long_answer_is_cut_at_the_bound(serve) -> None:
    size = MAX_RESPONSE_BYTES + 4096
    big = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: %d\r\n\r\n" % size + b"a" * size
    upstream = await serve(lambda n: big)
    session = upstream_session()
    try:
        result = await invoke(session, tool(upstream.port), {"id": "1"}, "e", 5000)
    finally:
        await session.close()
    assert not result.is_error
    assert len(result.content[0].text) == MAX_RESPONSE_BYTES


async def test_a_path_argument_cannot_reach_another_path_of_the_api(serve) -> None:
    """An argument an upstream could resolve as a dot segment (after decoding its escapes, or at a
    '/' or '\\' it decodes) is an error result, and the API is not called; a '/' in a plain argument
    stays inside its segment."""
    upstream = await serve(lambda n: OK)
    session = upstream_session()
    try:
        for sneaky in ("..", "../admin", "a/../../admin", "..\\admin", "%2e%2e", "%2E%2E%2Fadmin", "./x"):
            result = await invoke(session, tool(upstream.port), {"id": sneaky}, "e", 5000)
            assert result.is_error, sneaky
            assert result.content[0].text == (
                "invalid arguments: arguments.id cannot be an empty, '.' or '..' path segment"
            )
        assert upstream.requests == []
        for plain in ("a/b", "...", "v1.2"):
            assert not (await invoke(session, tool(upstream.port), {"id": plain}, "e", 5000)).is_error
    finally:
        await session.close()
    assert upstream.requests == [
        "GET /orders/a%2Fb HTTP/1.1",
        "GET /orders/... HTTP/1.1",
        "GET /orders/v1.2 HTTP/1.1",
    ]


class MidAnswer:
    """A raw server that sends an answer's headers and part of its body, then `then`s: closes the
    connection, or holds it open without another byte."""

    def __init__(self, then: str) -> None:
        self.then = then
        self.requests = 0
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        self.requests += 1
        writer.write(
            b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"ok":'
        )
        await writer.drain()
        if self.then == "hang":
            await asyncio.sleep(30)
        writer.close()


@pytest.mark.parametrize(
    ("then", "said"),
    [("close", "the API could not be reached"), ("hang", "the API did not answer within 0.3 s")],
)
@pytest.mark.parametrize("method", ["GET", "POST"])
async def test_an_answer_cut_or_stalled_mid_body_is_an_error_and_not_retried(
    then: str, said: str, method: str
) -> None:
    upstream = MidAnswer(then)
    server = await asyncio.start_server(upstream.handle, "127.0.0.1", 0)
    upstream.port = server.sockets[0].getsockname()[1]
    session = upstream_session()
    try:
        result = await asyncio.wait_for(
            invoke(session, tool(upstream.port, method, timeout_ms=300), {"id": "1"}, "e", 5000), 5
        )
    finally:
        await session.close()
        server.close()
    assert result.is_error
    assert result.content[0].text == said
    assert upstream.requests == 1
