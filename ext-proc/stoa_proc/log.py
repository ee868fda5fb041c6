"""The decision log: one `ext_proc_decision` event per exchange (route data, the closed reason,
timings: never body content), in the JSON log format every service writes (`stoa_ops.logs`), and
their counts for `/metrics`."""

from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter
from stoa_ops.logs import DecisionPlace

DECISION_LOGGER = "stoa_proc.decision"


class DecisionLog:
    """The decision events, and their counts by reason in `registry` (what `/metrics` exposes)."""

    def __init__(self) -> None:
        self._log = logging.getLogger(DECISION_LOGGER)
        self.registry = CollectorRegistry(auto_describe=False)
        self._exchanges = Counter(
            "stoa_proc_exchanges", "Exchanges processed, by outcome.", ["reason"], registry=self.registry
        )
        self._milliseconds = Counter(
            "stoa_proc_exchange_milliseconds", "Time spent in exchanges, summed.", registry=self.registry
        )

    def count(self, reason: str) -> float:
        """How many exchanges ended with `reason` so far."""
        return self.registry.get_sample_value("stoa_proc_exchanges_total", {"reason": reason}) or 0.0

    def emit(self, reason: str, place: DecisionPlace, latency_ms: float, *, phase: str) -> None:
        self._exchanges.labels(reason).inc()
        self._milliseconds.inc(latency_ms)
        self._log.info(
            "ext_proc_decision",
            extra={
                "fields": {
                    "reason": reason,
                    "phase": phase,
                    "tenant": place.tenant,
                    "api": place.api,
                    "route": place.route,
                    "request_id": place.request_id,
                    "latency_ms": round(latency_ms, 3),
                    "policy_set_version": place.policy_set_version,
                }
            },
        )
