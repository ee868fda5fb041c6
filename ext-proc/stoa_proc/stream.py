"""Phase 2 for a streamed response: server-sent events of an OpenAI-compatible completion.

Events are framed as a client's parser frames them (the event-stream format: lines end with CRLF,
LF or CR, an empty line ends an event, a leading byte-order mark is dropped), so no event escapes
this guard that a client would read. Only complete events pass (a partial event waits for the next
chunk), so nothing is forwarded before it has been inspected. Every string of each event is
inspected, and so is the text a client reconstructs of each choice: each of its strings
(`delta.content`, a tool call's `arguments`, a completion's `text`, …) concatenated over the events,
so a forbidden string split across two events is caught at the event that completes it; that event
and everything after are replaced by one `event: error` naming the reason. Already-sent text cannot
be redacted: on a stream, PII is blocked whatever the action.
"""

from __future__ import annotations

import json
import re
from typing import Any

from stoa_proc import decode
from stoa_proc.guardrails import Guardrails
from stoa_proc.reasons import Deny, Reason

# A match must lie within this tail of the reconstructed text (bounded work per event).
WINDOW_CHARS = 8192
# A line ends with CRLF, LF or CR (a CR followed by LF is one end, never an empty line after a CR).
_LINE_END = rb"(?:\r\n|\r(?!\n)|\n)"
EVENT_END = re.compile(_LINE_END + _LINE_END)
LINES = re.compile(r"\r\n|\r|\n")
_BOM = "\ufeff".encode()


def error_event(reason: Reason) -> bytes:
    return b"event: error\ndata: " + json.dumps({"error": reason.value}).encode() + b"\n\n"


def event_data(event: bytes) -> str | None:
    """The `data` of one event as a client's parser gives it (its `data` lines joined by LF; a bare
    `data` line is an empty one), or None for an event without data."""
    lines = []
    for line in LINES.split(event.decode("utf-8", errors="replace")):
        if line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
        elif line == "data":
            lines.append("")
    return "\n".join(lines) if lines else None


def _leaves(node: Any, path: tuple[object, ...], found: list[tuple[tuple[object, ...], str]]) -> None:
    """The strings of a choice by their place; an entry of a list that names its own `index` (a tool
    call) is placed by it, as a client accumulates it."""
    if isinstance(node, str):
        found.append((path, node))
    elif isinstance(node, dict):
        for key, value in node.items():
            _leaves(value, (*path, key), found)
    elif isinstance(node, list):
        for position, item in enumerate(node):
            index = item.get("index") if isinstance(item, dict) else None
            _leaves(item, (*path, index if isinstance(index, int) else position), found)


def _deltas(payload: Any) -> list[tuple[tuple[object, ...], str]]:
    """The strings of an event's `choices` by their place, whatever shape the member has (a client
    shows a choice it can read; what it cannot read is still inspected)."""
    if not isinstance(payload, dict) or "choices" not in payload:
        return []
    found: list[tuple[tuple[object, ...], str]] = []
    _leaves(payload["choices"], (), found)
    return found


class SseGuard:
    def __init__(self, guardrails: Guardrails) -> None:
        self._guardrails = guardrails
        self._pending = b""
        self._started = False
        self._content: dict[tuple[object, ...], str] = {}
        self.denied: Reason | None = None

    def feed(self, chunk: bytes, end_of_stream: bool) -> bytes:
        """What to pass on for this chunk: its complete, inspected events (or the error event)."""
        if self.denied is not None:
            return b""
        data = self._pending + chunk
        passed: list[bytes] = []
        start = 0
        if not self._started and (len(data) >= len(_BOM) or end_of_stream):
            self._started = True
            if data.startswith(_BOM):
                passed.append(_BOM)
                start = len(_BOM)
        elif not self._started:
            self._pending = data  # too short to tell whether it begins with a byte-order mark
            return b""
        while True:
            found = EVENT_END.search(data, start)
            if found is None:
                break
            event = data[start : found.end()]
            start = found.end()
            if not self._inspect(event):
                return b"".join(passed) + error_event(self.denied or Reason.GUARDRAIL_BLOCKED)
            passed.append(event)
        self._pending = data[start:]
        if end_of_stream and self._pending:
            if not self._inspect(self._pending):
                return b"".join(passed) + error_event(self.denied or Reason.GUARDRAIL_BLOCKED)
            passed.append(self._pending)
            self._pending = b""
        if len(self._pending) > self._guardrails.max_body_bytes:
            self.denied = Reason.TOO_LARGE
            return b"".join(passed) + error_event(Reason.TOO_LARGE)
        return b"".join(passed)

    def _inspect(self, event: bytes) -> bool:
        data = event_data(event)
        if data is None or data.strip() == "[DONE]":
            return True
        try:
            payload = decode.sniffed_json(data)
            if payload is decode.NOT_JSON:
                # No completion chunk (or JSON nested past what is parsed here): its text as it comes,
                # and with its escapes decoded, as a client may show it.
                self._guardrails.check_texts([data, *decode.decoded_views("", data)], block_pii=True)
                return True
            # The strings outside the choices (an error's message), each event on its own, and what a
            # client reconstructs of each string of a choice: one screen over them all.
            rest = (
                {k: v for k, v in payload.items() if k != "choices"} if isinstance(payload, dict) else payload
            )
            texts = decode.strings(rest)
            for place, piece in _deltas(payload):
                text = (self._content.get(place, "") + piece)[-WINDOW_CHARS:]
                self._content[place] = text
                texts.append(text)
            self._guardrails.check_texts(texts, block_pii=True)
        except Deny as deny:
            self.denied = deny.reason
            return False
        return True
