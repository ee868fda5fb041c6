"""JSON-lines logging: every log record is one JSON object on stderr, and one `ext_proc_decision`
event per exchange (route data, the closed reason, timings: never body content)."""

from __future__ import annotations

import json
import logging
import sys
import threading
import time
from collections import Counter

DECISION_LOGGER = "stoa_proc.decision"

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
    logging.Formatter.converter = time.gmtime


class DecisionLog:
    """The decision events, and their counts by reason for `/metrics`."""

    def __init__(self) -> None:
        self._log = logging.getLogger(DECISION_LOGGER)
        self._lock = threading.Lock()
        self.counts: Counter[str] = Counter()
        self.latency_sum_ms = 0.0

    def emit(
        self,
        reason: str,
        *,
        phase: str,
        tenant: str,
        api: str,
        route: str,
        request_id: str,
        latency_ms: float,
        policy_set_version: str,
    ) -> None:
        with self._lock:
            self.counts[reason] += 1
            self.latency_sum_ms += latency_ms
        self._log.info(
            "ext_proc_decision",
            extra={
                "event": "ext_proc_decision",
                "reason": reason,
                "phase": phase,
                "tenant": tenant,
                "api": api,
                "route": route,
                "request_id": request_id,
                "latency_ms": round(latency_ms, 3),
                "policy_set_version": policy_set_version,
            },
        )
