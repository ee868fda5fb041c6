"""Footprint with 5,000 routes: the Link's resident memory and CPU at rest (SYNCED, no changes), and
the number of metric series exposed (sample lines of Envoy's /stats/prometheus and the Link's /metrics)."""

from __future__ import annotations

import time
from typing import Any

import httpx

from stoa_harness.bench.rig import Rig, cpu_seconds, rss_mib, session_pids


def series(prometheus_text: str) -> int:
    """Sample lines in a Prometheus text exposition (comments and blank lines are not series)."""
    return sum(1 for line in prometheus_text.splitlines() if line and not line.startswith("#"))


def run(rig: Rig, *, window_s: float) -> dict[str, Any]:
    estate = rig.estate
    estate.admin.wait_synced(timeout=60)
    pids = session_pids(rig.link_pid)
    before = cpu_seconds(pids)
    time.sleep(window_s)  # the measurement window itself, not a wait for a condition
    after = cpu_seconds(pids)
    envoy_series = series(estate.envoy.admin_get("/stats/prometheus").text)
    link_metrics = httpx.get(f"{estate.link_http_url}/metrics", timeout=10.0)
    link_metrics.raise_for_status()
    link_series = series(link_metrics.text)
    return {
        "link_rss_mib_5000": sum(rss_mib(p) for p in pids),
        "link_cpu_percent_at_rest_5000": (after.seconds - before.seconds) / (after.at - before.at) * 100,
        "window_s": window_s,
        "metric_series": envoy_series + link_series,
        "envoy_metric_series": envoy_series,
        "link_metric_series": link_series,
        "routes_in_envoy": estate.envoy.route_count(),
    }
