"""Phase 2 for a streamed response: server-sent events of an OpenAI-compatible completion.

Only complete events pass (a partial event waits for the next chunk), so nothing is forwarded before
it has been inspected. The text a client reconstructs — each choice's `delta.content`, concatenated —
is inspected after every event, so a forbidden string split across two events is caught at the event
that completes it; that event and everything after are replaced by one `event: error` naming the
reason. Already-sent text cannot be redacted: on a stream, PII is blocked whatever the action.
"""

from __future__ import annotations

import json
import re
from typing import Any

from stoa_proc.guardrails import Guardrails
from stoa_proc.reasons import Deny, Reason

# A match must lie within this tail of the reconstructed text (bounded work per event).
WINDOW_CHARS = 8192
_EVENT_END = re.compile(rb"\r\n\r\n|\n\n|\r\r")


def error_event(reason: Reason) -> bytes:
    return b"event: error\ndata: " + json.dumps({"error": reason.value}).encode() + b"\n\n"


def _data(event: bytes) -> str | None:
    lines = []
    for line in event.decode("utf-8", errors="replace").splitlines():
        if line.startswith("data:"):
            lines.append(line[5:].removeprefix(" "))
    return "\n".join(lines) if lines else None


def _deltas(payload: Any) -> list[tuple[int, str]]:
    if not isinstance(payload, dict) or not isinstance(payload.get("choices"), list):
        return []
    found = []
    for choice in payload["choices"]:
        if not isinstance(choice, dict):
            continue
        index = choice.get("index", 0)
        for holder in (choice.get("delta"), choice.get("message")):
            if isinstance(holder, dict) and isinstance(holder.get("content"), str):
                found.append((index if isinstance(index, int) else 0, holder["content"]))
    return found


class SseGuard:
    def __init__(self, guardrails: Guardrails) -> None:
        self._guardrails = guardrails
        self._pending = b""
        self._content: dict[int, str] = {}
        self.denied: Reason | None = None

    def feed(self, chunk: bytes, end_of_stream: bool) -> bytes:
        """What to pass on for this chunk: its complete, inspected events (or the error event)."""
        if self.denied is not None:
            return b""
        data = self._pending + chunk
        passed: list[bytes] = []
        start = 0
        while True:
            found = _EVENT_END.search(data, start)
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
        data = _data(event)
        if data is None or data.strip() == "[DONE]":
            return True
        try:
            payload = json.loads(data)
        except (ValueError, RecursionError):
            return True  # not a completion chunk: no reconstructed text to inspect
        for index, piece in _deltas(payload):
            text = (self._content.get(index, "") + piece)[-WINDOW_CHARS:]
            self._content[index] = text
            try:
                self._guardrails.check_text(text, block_pii=True)
            except Deny as deny:
                self.denied = deny.reason
                return False
        return True
