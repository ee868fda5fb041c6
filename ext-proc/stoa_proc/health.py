"""Readiness and metrics, in one place: the gRPC health service and the operator endpoint
(`stoa_ops.endpoint`) read the same state. Ready = at least one policy set is loaded."""

from __future__ import annotations

from collections.abc import Iterator

from grpc_health.v1 import health, health_pb2
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from stoa_proc.policy import PolicyStore

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"


class Readiness:
    def __init__(self, store: PolicyStore) -> None:
        self._store = store
        self.grpc = health.aio.HealthServicer()

    @property
    def ready(self) -> bool:
        return bool(self._store)

    def state(self) -> tuple[str | None, dict[str, object]]:
        """What `/health/ready` answers: why not ready (or None), and the policy sets held."""
        return (None if self.ready else "policy_unavailable"), {"policy_set_versions": self._store.versions()}

    async def publish(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await self.grpc.set(name, status)


class ProcCollector(Collector):
    """`/metrics`: the policy sets held, read at scrape time."""

    def __init__(self, store: PolicyStore) -> None:
        self._store = store

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "stoa_proc_policy_sets",
            "Policy sets held (the newest and a few older ones).",
            value=len(self._store.versions()),
        )
