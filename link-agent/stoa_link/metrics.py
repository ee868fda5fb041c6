"""The Link's `/metrics`: a prometheus-client collector over the Link's live state.

Most values are read at scrape time (the ADS server's streams, the acknowledged snapshot, the CP
stream); the agent's own counts are prometheus-client metrics it updates as it reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector
from stoa_translate.snapshot import ROUTE

from stoa_link.ads import AdsServer

# Publications take milliseconds when nothing waits, seconds when Envoy reloads 10,000 routes, and the
# ACK deadline (10 s by default) when a client is missing.
PUBLISH_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


def _reports() -> Counter:
    return Counter(
        "stoa_link_publications",
        "Sync reports by outcome and failure reason",
        ["outcome", "reason"],
        registry=None,
    )


def _publish_seconds() -> Histogram:
    return Histogram(
        "stoa_link_publish_seconds",
        "Time from taking a delivery to its sync report (guard, translate, ADS publication, store)",
        buckets=PUBLISH_BUCKETS_S,
        registry=None,
    )


@dataclass
class PublicationStats:
    """What the agent saw and decided; the rest of the series are read from the ADS server and the CP."""

    desired_generation_seen: int = 0
    reports: Counter = field(default_factory=_reports)  # labels: outcome, reason
    publish_seconds: Histogram = field(default_factory=_publish_seconds)


def route_count(ads: AdsServer) -> int:
    """Routes in the acknowledged snapshot, counted as Envoy holds them (every virtual host's routes)."""
    snapshot = ads.acked_snapshot
    if snapshot is None:
        return 0
    return sum(len(vhost.routes) for config in snapshot.of(ROUTE) for vhost in config.virtual_hosts)  # type: ignore[attr-defined]


class LinkCollector(Collector):
    def __init__(
        self,
        stats: PublicationStats,
        ads: AdsServer,
        cp_connected: Callable[[], bool],
        refetches: Callable[[], Mapping[str, int]] = dict,
    ) -> None:
        self._stats = stats
        self._ads = ads
        self._cp_connected = cp_connected
        self._refetches = refetches

    def collect(self) -> Iterator[Metric]:
        ads, stats = self._ads, self._stats
        acked = ads.acked_snapshot
        yield GaugeMetricFamily(
            "stoa_link_applied_generation",
            "Generation of the snapshot every required client acknowledged (0: none yet)",
            value=acked.generation if acked else 0,
        )
        yield GaugeMetricFamily(
            "stoa_link_desired_generation_seen",
            "Highest generation received from the control plane",
            value=stats.desired_generation_seen,
        )
        yield from stats.reports.collect()
        yield from stats.publish_seconds.collect()
        clients = GaugeMetricFamily(
            "stoa_link_ads_clients", "Connected ADS streams per required client identity", labels=["identity"]
        )
        for identity in ads.identities:
            clients.add_metric([identity], ads.connected(identity))
        yield clients
        nacks = CounterMetricFamily(
            "stoa_link_nacks", "NACKs received, by resource type", labels=["type_url"]
        )
        for type_url, n in sorted(ads.nacks.items()):
            nacks.add_metric([type_url], n)
        yield nacks
        yield GaugeMetricFamily(
            "stoa_link_routes", "Routes in the acknowledged snapshot", value=route_count(ads)
        )
        yield GaugeMetricFamily(
            "stoa_link_cp_connected",
            "1 while the control plane's event stream is open",
            value=1 if self._cp_connected() else 0,
        )
        refetches = CounterMetricFamily(
            "stoa_link_inventory_refetches",
            "Complete inventories fetched because a delta did not apply (gap, mismatch, unreadable)",
            labels=["why"],
        )
        for why, n in sorted(self._refetches().items()):
            refetches.add_metric([why], n)
        yield refetches


def link_registry(
    stats: PublicationStats,
    ads: AdsServer,
    cp_connected: Callable[[], bool],
    refetches: Callable[[], Mapping[str, int]] = dict,
) -> CollectorRegistry:
    """The registry `/metrics` exposes: every Link series, read at scrape time (`refetches`: the CP
    client's complete fetches caused by deltas, by why)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LinkCollector(stats, ads, cp_connected, refetches))
    return registry
