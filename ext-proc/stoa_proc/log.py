"""The decision log: one `ext_proc_decision` event per exchange (route data, the closed reason,
timings: never body content), in the JSON log format every service writes (`stoa_ops.logs`), and
their counts for `/metrics`.

Decision events do not go through `logging`: they are written in the same shape (ts, level, logger,
event, then the fields), buffered (`stoa_ops.logs.BufferedLines`), because a LogRecord, a handler
lock and a write syscall per exchange cost about a third of a guarded exchange's own work.
"""

from __future__ import annotations

import time
from typing import Any, TextIO

from prometheus_client import CollectorRegistry, Counter
from stoa_ops import logs
from stoa_ops.logs import DecisionPlace

DECISION_LOGGER = "stoa_proc.decision"


class DecisionLog(logs.BufferedLines):
    """The decision events, and their counts by reason in `registry` (what `/metrics` exposes)."""

    def __init__(self, stream: TextIO | None = None, **buffering: Any) -> None:
        super().__init__(stream, **buffering)
        self.registry = CollectorRegistry(auto_describe=False)
        self._exchanges = Counter(
            "stoa_proc_exchanges", "Exchanges processed, by outcome.", ["reason"], registry=self.registry
        )
        self._milliseconds = Counter(
            "stoa_proc_exchange_milliseconds", "Time spent in exchanges, summed.", registry=self.registry
        )
        self._by_reason: dict[str, Any] = {}

    def count(self, reason: str) -> float:
        """How many exchanges ended with `reason` so far."""
        return self.registry.get_sample_value("stoa_proc_exchanges_total", {"reason": reason}) or 0.0

    def emit(self, reason: str, place: DecisionPlace, latency_ms: float, *, phase: str) -> None:
        counter = self._by_reason.get(reason)
        if counter is None:
            counter = self._by_reason[reason] = self._exchanges.labels(reason)
        counter.inc()
        self._milliseconds.inc(latency_ms)
        # Reason and phase are closed sets of snake_case names: they need no escaping.
        self.append(
            f"{logs.head(time.time(), 'info', DECISION_LOGGER, 'ext_proc_decision')}"
            f'"reason":"{reason}","phase":"{phase}",{place.tail(latency_ms)}'
        )
