"""What the official MCP conformance suite (npm `@modelcontextprotocol/conformance`, server
scenarios) needs to run against a gateway's MCP route:

- `FixtureApi`: the HTTP API behind its fixture tools (each tool is an operation of it, as every
  tool is): plain text, a PNG image, a WAV sound, an error;
- `FIXTURE_TOOLS`: those tools as a tenant registers them on the CP;
- `TokenProxy`: a loopback proxy that adds the bearer token the suite has no way to send, in front of
  the gateway's MCP route (bodies and server-sent event streams pass through as they come);
- `run_suite`: the suite itself, on the Node 22 that `make setup` installs in `conformance/`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import httpx

from stoa_harness.asgi_thread import Receive, Scope, Send, ThreadedASGIServer, read_body

REPO = Path(__file__).resolve().parents[2]
SUITE_DIR = REPO / "conformance"
EXPECTED_FAILURES = SUITE_DIR / "expected-failures.yaml"

SIMPLE_TEXT = "This is a simple text response for testing."
# A 1x1 red PNG and a 1-sample WAV, as the suite's notes suggest.
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8DwHwAFBQIAX8jx0gAAAABJRU5ErkJggg=="
)
WAV = (
    b"RIFF" + (36 + 2).to_bytes(4, "little") + b"WAVEfmt " + (16).to_bytes(4, "little")
    + (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (8000).to_bytes(4, "little")
    + (16000).to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    + b"data" + (2).to_bytes(4, "little") + b"\x00\x00"
)  # fmt: skip
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {}}
SCHEMA_2020_12: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {
        "address": {
            "type": "object",
            "properties": {"street": {"type": "string"}, "city": {"type": "string"}},
        }
    },
    "properties": {"name": {"type": "string"}, "address": {"$ref": "#/$defs/address"}},
    "additionalProperties": False,
}

# name → (description, input schema, path on the fixture API)
FIXTURE_TOOLS: dict[str, tuple[str, dict[str, Any], str]] = {
    "test_simple_text": ("Returns a simple text", NO_ARGUMENTS, "/text"),
    "test_image_content": ("Returns a PNG image", NO_ARGUMENTS, "/image"),
    "test_audio_content": ("Returns a WAV sound", NO_ARGUMENTS, "/audio"),
    "test_error_handling": ("Always fails", NO_ARGUMENTS, "/error"),
    "json_schema_2020_12_tool": ("Tool with JSON Schema 2020-12 features", SCHEMA_2020_12, "/text"),
}


class FixtureApi(ThreadedASGIServer):
    """The API the fixture tools are operations of."""

    def __init__(self) -> None:
        super().__init__(self._app, "conformance-api")

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        await read_body(receive)
        status, media, body = {
            "/text": (200, "text/plain; charset=utf-8", SIMPLE_TEXT.encode()),
            "/image": (200, "image/png", PNG),
            "/audio": (200, "audio/wav", WAV),
            "/error": (500, "text/plain", b"This tool intentionally returns an error for testing"),
        }.get(scope["path"], (404, "text/plain", b"not found"))
        headers = [(b"content-type", media.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


# The Host header passes as the client sent it: the module's DNS-rebinding check sees it.
_HOP_BY_HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"authorization"}


class TokenProxy(ThreadedASGIServer):
    """Every request to `target` (any path, the same method, headers and body) with
    `Authorization: Bearer <token>` added; the answer streamed back as it comes."""

    def __init__(self, target: str, token: str) -> None:
        super().__init__(self._app, "conformance-token-proxy")
        self.target = target
        self.token = token

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = [(k, v) for k, v in scope["headers"] if k.lower() not in _HOP_BY_HOP]
        headers.append((b"authorization", f"Bearer {self.token}".encode()))
        url = self.target + (f"?{scope['query_string'].decode()}" if scope["query_string"] else "")
        async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None)) as client:
            request = client.build_request(scope["method"], url, headers=headers, content=body)
            response = await client.send(request, stream=True)
            try:
                await send(
                    {
                        "type": "http.response.start",
                        "status": response.status_code,
                        "headers": [
                            (k.lower(), v)
                            for k, v in response.headers.raw
                            if k.lower() not in (b"connection", b"transfer-encoding", b"content-length")
                        ],
                    }
                )
                async for chunk in response.aiter_raw():
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                await send({"type": "http.response.body", "body": b""})
            except (httpx.HTTPError, OSError):
                return  # the client or the gateway closed a stream: nothing more to relay
            finally:
                with contextlib.suppress(Exception):
                    await response.aclose()


def node_bin() -> Path:
    return SUITE_DIR / "node_modules" / ".bin"


def run_suite(url: str, output_dir: Path, timeout_s: float = 600) -> tuple[int, str, dict[str, Any]]:
    """(exit code, output, results by scenario) of the suite's server scenarios against `url`, with
    the expected failures of `conformance/expected-failures.yaml`."""
    bin_dir = node_bin()
    command = [
        str(bin_dir / "node"),
        str(bin_dir / "conformance"),
        "server",
        "--url",
        url,
        "--expected-failures",
        str(EXPECTED_FAILURES),
        "-o",
        str(output_dir),
    ]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={"PATH": f"{bin_dir}:/usr/bin:/bin", "NO_COLOR": "1", "HOME": str(output_dir)},
    )
    results: dict[str, Any] = {}
    for checks in output_dir.rglob("checks.json"):
        # Each scenario's directory: server-<scenario>-<timestamp>.
        scenario = re.sub(r"-\d{4}-\d{2}-\d{2}T.*$", "", checks.parent.name.removeprefix("server-"))
        results[scenario] = json.loads(checks.read_text())
    return done.returncode, done.stdout + done.stderr, results
