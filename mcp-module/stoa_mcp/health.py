"""Readiness and metrics on the operator endpoint (`stoa_ops.endpoint`). Ready = the module can
enforce: a valid artifact is held (503 `no_artifact` until one arrives, `artifact_expired` once it
lapsed) and the tool registry is loaded (`no_registry`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from stoa_mcp.server import McpModule


def readiness(module: McpModule) -> tuple[str | None, dict[str, object]]:
    """What `/health/ready` answers: why the module cannot enforce (or None), and what it holds."""
    reason = module.not_ready()
    held = module.permissions.held
    if reason is not None or held is None:
        return reason or "no_artifact", {}
    return None, {"seq": held.claims.seq, "kid": held.kid, "expires_at": held.claims.exp}


class McpCollector(Collector):
    """`/metrics`, read from the module's state at scrape time."""

    def __init__(self, module: McpModule) -> None:
        self._module = module

    def collect(self) -> Iterator[Metric]:
        module = self._module
        calls = CounterMetricFamily(
            "stoa_mcp_tool_calls", "tools/call answered, by outcome.", labels=["outcome"]
        )
        for outcome, count in sorted(module.calls.items()):
            calls.add_metric([outcome], count)
        yield calls
        refused = CounterMetricFamily(
            "stoa_mcp_permissions_refused", "Signed tool permissions refused, by reason.", labels=["reason"]
        )
        for reason, count in sorted(module.permissions.refusals.items()):
            refused.add_metric([reason[:120]], count)
        yield refused
        held = module.permissions.held
        yield GaugeMetricFamily(
            "stoa_mcp_permissions_seq",
            "The seq of the tool permissions held (0: none).",
            value=held.claims.seq if held else 0,
        )
        yield GaugeMetricFamily(
            "stoa_mcp_permissions_expires_at",
            "Expiry of the tool permissions held (Unix time; 0: none).",
            value=held.claims.exp if held else 0,
        )
        yield GaugeMetricFamily(
            "stoa_mcp_ready", "1 when the module can enforce.", value=0 if module.not_ready() else 1
        )
