"""Calling a tool: the arguments checked against its input schema, then one request to the backing
API's upstream — directly, with the caller's identity envelope and a bounded timeout, never retried —
and its answer as the tool's result (`structuredContent` too when the tool has an output schema).

The grant is the authorization of the call; the API's own route (its token check, its rate limit) is
not on this path, the MCP budget is.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import aiohttp
import mcp_types as types
from stoa_proto.bodies import media_type
from stoa_proto.decisions import IDENTITY_HEADER
from stoa_translate.tools import ToolError, expand
from yarl import URL

from stoa_mcp.registry import CompiledTool

log = logging.getLogger("stoa_mcp.call")

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
MAX_RESPONSE_BYTES = 1024 * 1024


def upstream_session() -> aiohttp.ClientSession:
    """The module's one client of the backing APIs: pooled keep-alive connections, no redirects
    followed, no cookies kept, no proxy from the environment, and never a retry."""
    session = aiohttp.ClientSession(
        cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, connector=aiohttp.TCPConnector(limit=0)
    )
    # aiohttp sends an idempotent request (GET, PUT, DELETE) again on a new connection when a kept-alive
    # one turns out closed; a tools/call must reach its API at most once. It has no public switch for
    # this (its own test client sets the same attribute); a unit test holds it.
    session._retry_connection = False
    return session


def _content(content_type: str, body: bytes, text: str) -> types.ContentBlock:
    """The API's answer as MCP content: an image or audio body as such (base64), anything else as text."""
    media = media_type(content_type)
    if media.startswith("image/"):
        return types.ImageContent(type="image", data=base64.b64encode(body).decode("ascii"), mime_type=media)
    if media.startswith("audio/"):
        return types.AudioContent(type="audio", data=base64.b64encode(body).decode("ascii"), mime_type=media)
    return types.TextContent(type="text", text=text)


def error_result(message: str) -> types.CallToolResult:
    """A tool error the agent can read and act on (not a protocol error)."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)], is_error=True)


def invalid_arguments(tool: CompiledTool, arguments: dict[str, Any]) -> str | None:
    """Why `arguments` do not satisfy the tool's input schema (the first problem), or None."""
    error = next(iter(sorted(tool.input_validator.iter_errors(arguments), key=lambda e: list(e.path))), None)
    if error is None:
        return None
    where = "/".join(str(p) for p in error.absolute_path)
    return f"invalid arguments{f' at /{where}' if where else ''}: {error.message}"


async def _read(response: aiohttp.ClientResponse) -> bytes:
    """The body, at most MAX_RESPONSE_BYTES of it (the rest is not read: the connection is dropped)."""
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_RESPONSE_BYTES:
            break
    return b"".join(chunks)[:MAX_RESPONSE_BYTES]


async def invoke(
    session: aiohttp.ClientSession,
    tool: CompiledTool,
    arguments: dict[str, Any],
    envelope: str,
    timeout_ms: int,
) -> types.CallToolResult:
    problem = invalid_arguments(tool, arguments)
    if problem is not None:
        return error_result(problem)
    try:
        path, rest = expand(tool.spec.path_template, arguments)
    except ToolError as exc:
        return error_result(f"invalid arguments: {exc}")
    # Sent as written: each path argument is already percent-encoded as one segment.
    url = URL(tool.spec.upstream_url.rstrip("/") + path, encoded=True)
    timeout = min(timeout_ms, tool.spec.timeout_ms or timeout_ms) / 1000
    request: dict[str, Any] = {
        "headers": {IDENTITY_HEADER: envelope, "accept": "application/json"},
        "timeout": aiohttp.ClientTimeout(total=timeout),
        "allow_redirects": False,
    }
    if tool.spec.method in BODY_METHODS:
        request["json"] = rest
    elif rest:
        request["params"] = {k: v if isinstance(v, str) else json.dumps(v) for k, v in rest.items()}
    try:
        async with session.request(tool.spec.method, url, **request) as response:
            body = await _read(response)
            status, content_type = response.status, response.headers.get("content-type", "")
    except TimeoutError:
        return error_result(f"the API did not answer within {timeout:g} s")
    except aiohttp.ClientError as exc:
        log.warning("upstream unreachable", extra={"tool": tool.name, "error": type(exc).__name__})
        return error_result("the API could not be reached")
    text = body.decode("utf-8", "replace")
    if not 200 <= status < 300:
        return error_result(f"the API answered {status}: {text[:2000]}")
    if tool.output_validator is None:
        return types.CallToolResult(content=[_content(content_type, body, text)])
    try:
        structured = json.loads(body)
    except ValueError:
        return error_result("the API's answer is not JSON, and the tool declares an output schema")
    failing = next(iter(tool.output_validator.iter_errors(structured)), None)
    if failing is not None:
        return error_result(f"the API's answer does not match the tool's output schema: {failing.message}")
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(structured))], structured_content=structured
    )
