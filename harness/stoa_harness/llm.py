"""A fake OpenAI-compatible model upstream: `POST …/chat/completions`, streamed or not, with `usage`.

The answer is scripted as pieces of text: a plain completion joins them into one message; a streamed
one (`"stream": true`) sends one server-sent event per piece, then (with `stream_options.include_usage`)
a final chunk with `usage`, then `data: [DONE]`. Every request is recorded, so a test can prove what
reached the model. Runs in-process like the echo upstream.

    with FakeLLM() as llm:
        llm.script(["Hello", " world"])      # the next answers' pieces
        llm.script(["a", "b"], pause_s=0.5, usage={"total_tokens": -1})  # slow events, odd usage
        llm.requests()                       # [(headers, body bytes)] as received
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from stoa_harness.asgi_thread import Receive, Scope, Send, ServedByThread, ThreadedASGIServer, read_body

MODEL = "stoa-fake-1"


@dataclass(frozen=True)
class Received:
    path: str
    headers: Mapping[str, str]
    body: bytes


def _tokens(text: str) -> int:
    # One token per whitespace-separated word: deterministic, which is all the tests need.
    return max(1, len(text.split()))


class FakeLLM(ServedByThread):
    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        self._lock = threading.Lock()
        self._pieces: tuple[str, ...] = ("Hello", " from", " the", " model.")
        self._gzip = False
        self._pause_s = 0.0
        self._usage: Mapping[str, object] | None = None
        self._events: tuple[bytes, ...] = ()
        self._stream_type = b"text/event-stream"
        self._received: list[Received] = []
        self._http = ThreadedASGIServer(self._app, "fake-llm", host, port)

    def script(
        self,
        pieces: Sequence[str],
        *,
        gzip_body: bool = False,
        pause_s: float = 0.0,
        usage: Mapping[str, object] | None = None,
        events: Sequence[bytes] = (),
        stream_type: str = "text/event-stream",
    ) -> None:
        """The pieces of every following answer; `gzip_body`: a non-streamed answer is gzip-encoded;
        `pause_s`: a streamed answer waits that long before each piece, a buffered one before it
        starts; `usage`: reported instead of the counted one; `events`: a streamed answer is these
        bytes, chunk by chunk, as given (a server's own framing), with `stream_type` as its type."""
        with self._lock:
            self._events = tuple(events)
            self._stream_type = stream_type.encode()
            self._pieces = tuple(pieces)
            self._gzip = gzip_body
            self._pause_s = pause_s
            self._usage = usage

    def requests(self) -> list[Received]:
        with self._lock:
            return list(self._received)

    def clear(self) -> None:
        with self._lock:
            self._received.clear()

    async def _app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = await read_body(receive)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        with self._lock:
            self._received.append(Received(scope["path"], headers, body))
            pieces, compress, pause_s, scripted_usage = self._pieces, self._gzip, self._pause_s, self._usage
            events, stream_type = self._events, self._stream_type
        try:
            request = json.loads(body) if body else {}
        except ValueError:
            request = {}
        if not isinstance(request, dict):
            request = {}
        prompt = json.dumps(request.get("messages", ""))
        usage = {
            "prompt_tokens": _tokens(prompt),
            "completion_tokens": sum(_tokens(p) for p in pieces),
        }
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        reported: Mapping[str, object] = usage if scripted_usage is None else scripted_usage
        if request.get("stream") is True and events:
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", stream_type)]}
            )
            for event in events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
            return
        if request.get("stream") is True:
            include_usage = bool((request.get("stream_options") or {}).get("include_usage"))
            await self._stream(send, pieces, reported, include_usage, pause_s)
            return
        payload = json.dumps(
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "".join(pieces)},
                        "finish_reason": "stop",
                    }
                ],
                "usage": reported,
            }
        ).encode()
        extra: list[tuple[bytes, bytes]] = []
        if pause_s:
            await asyncio.sleep(pause_s)  # a slow model: nothing is answered meanwhile
        if compress:
            payload = gzip.compress(payload)
            extra.append((b"content-encoding", b"gzip"))
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(payload)).encode()),
                    *extra,
                ],
            }
        )
        await send({"type": "http.response.body", "body": payload})

    async def _stream(
        self,
        send: Send,
        pieces: Sequence[str],
        usage: Mapping[str, object],
        include_usage: bool,
        pause_s: float,
    ) -> None:
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")],
            }
        )

        def chunk(delta: dict[str, str], finish: str | None = None, with_usage: bool = False) -> bytes:
            event: dict[str, object] = {
                "id": "chatcmpl-fake",
                "object": "chat.completion.chunk",
                "model": MODEL,
                "choices": [] if with_usage else [{"index": 0, "delta": delta, "finish_reason": finish}],
            }
            if with_usage:
                event["usage"] = usage
            return b"data: " + json.dumps(event).encode() + b"\n\n"

        await send({"type": "http.response.body", "body": chunk({"role": "assistant"}), "more_body": True})
        for piece in pieces:
            if pause_s:
                await asyncio.sleep(pause_s)  # a slow model, as a client sees one
            await send({"type": "http.response.body", "body": chunk({"content": piece}), "more_body": True})
        tail = chunk({}, "stop")
        if include_usage:
            tail += chunk({}, with_usage=True)
        await send({"type": "http.response.body", "body": tail + b"data: [DONE]\n\n"})
