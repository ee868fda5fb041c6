"""JSON-lines logging: one JSON object per record on stderr (tool names and outcomes, never
arguments, results or tokens)."""

from __future__ import annotations

import json
import logging
import sys

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message"}


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        event: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        event.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info and record.exc_info[0] is not None:
            event["exception"] = record.exc_info[0].__name__
        return json.dumps(event, default=str, separators=(",", ":"))


def configure(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    logging.getLogger("httpx").setLevel(logging.WARNING)
