"""The Link's `/metrics`: Prometheus text exposition (format 0.0.4), written here.

Most values are read from live state at scrape time (the ADS server's streams, the acknowledged
snapshot, the CP stream); prometheus_client would need a custom collector for each of them, so the
few lines of the text format are cheaper than the dependency.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from stoa_translate.snapshot import ROUTE

from stoa_link.ads import AdsServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Publications take milliseconds when nothing waits, seconds when Envoy reloads 10,000 routes, and the
# ACK deadline (10 s by default) when a client is missing.
PUBLISH_BUCKETS_S: tuple[float, ...] = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass
class Histogram:
    bounds: tuple[float, ...] = PUBLISH_BUCKETS_S
    buckets: list[int] = field(init=False)  # per bound, not cumulative
    sum: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.buckets = [0] * len(self.bounds)

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.buckets[i] += 1
                return


@dataclass
class PublicationStats:
    """What the agent saw and decided; the rest of the series are read from the ADS server and the CP."""

    desired_generation_seen: int = 0
    reports: Counter[tuple[str, str]] = field(default_factory=Counter)  # (outcome, reason)
    publish_seconds: Histogram = field(default_factory=Histogram)


Sample = tuple[str, Mapping[str, str], float]  # name suffix, labels, value


@dataclass(frozen=True)
class Family:
    name: str
    kind: Literal["gauge", "counter", "histogram"]
    help: str
    samples: Sequence[Sample]


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels.items()) + "}"


def exposition(families: Iterable[Family]) -> str:
    lines: list[str] = []
    for family in families:
        lines.append(f"# HELP {family.name} {family.help}")
        lines.append(f"# TYPE {family.name} {family.kind}")
        lines.extend(
            f"{family.name}{suffix}{_labels(labels)} {_number(value)}"
            for suffix, labels, value in family.samples
        )
    return "\n".join(lines) + "\n"


def histogram_samples(histogram: Histogram) -> list[Sample]:
    samples: list[Sample] = []
    cumulative = 0
    for bound, count in zip(histogram.bounds, histogram.buckets, strict=True):
        cumulative += count
        samples.append(("_bucket", {"le": _number(bound)}, cumulative))
    samples.append(("_bucket", {"le": "+Inf"}, histogram.count))
    samples.append(("_sum", {}, histogram.sum))
    samples.append(("_count", {}, histogram.count))
    return samples


def route_count(ads: AdsServer) -> int:
    """Routes in the acknowledged snapshot, counted as Envoy holds them (every virtual host's routes)."""
    snapshot = ads.acked_snapshot
    if snapshot is None:
        return 0
    return sum(len(vhost.routes) for config in snapshot.of(ROUTE) for vhost in config.virtual_hosts)  # type: ignore[attr-defined]


def link_families(stats: PublicationStats, ads: AdsServer, cp_connected: bool) -> list[Family]:
    acked = ads.acked_snapshot
    return [
        Family(
            "stoa_link_applied_generation",
            "gauge",
            "Generation of the snapshot every required client acknowledged (0: none yet)",
            [("", {}, acked.generation if acked else 0)],
        ),
        Family(
            "stoa_link_desired_generation_seen",
            "gauge",
            "Highest generation received from the control plane",
            [("", {}, stats.desired_generation_seen)],
        ),
        Family(
            "stoa_link_publications_total",
            "counter",
            "Sync reports by outcome and failure reason",
            [
                ("", {"outcome": outcome, "reason": reason}, n)
                for (outcome, reason), n in sorted(stats.reports.items())
            ],
        ),
        Family(
            "stoa_link_publish_seconds",
            "histogram",
            "Time from taking a delivery to its sync report (guard, translate, ADS publication, store)",
            histogram_samples(stats.publish_seconds),
        ),
        Family(
            "stoa_link_ads_clients",
            "gauge",
            "Connected ADS streams per required client identity",
            [("", {"identity": identity}, ads.connected(identity)) for identity in ads.identities],
        ),
        Family(
            "stoa_link_nacks_total",
            "counter",
            "NACKs received, by resource type",
            [("", {"type_url": type_url}, n) for type_url, n in sorted(ads.nacks.items())],
        ),
        Family(
            "stoa_link_routes",
            "gauge",
            "Routes in the acknowledged snapshot",
            [("", {}, route_count(ads))],
        ),
        Family(
            "stoa_link_cp_connected",
            "gauge",
            "1 while the control plane's event stream is open",
            [("", {}, 1 if cp_connected else 0)],
        ),
    ]
