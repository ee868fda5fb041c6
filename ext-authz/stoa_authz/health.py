"""Readiness, in one place: the gRPC health service and the operator endpoint (`stoa_ops.endpoint`:
`/health/ready`, `/metrics`) read the same state.

Ready = an audience is configured and at least one policy set is loaded.
"""

from __future__ import annotations

from collections.abc import Iterator

from grpc_health.v1 import health, health_pb2
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from stoa_authz.policy import PolicyStore

SERVICE_NAME = "envoy.service.auth.v3.Authorization"


class Readiness:
    def __init__(self, audience_configured: bool, store: PolicyStore) -> None:
        self._audience_configured = audience_configured
        self._store = store
        # The synchronous servicer: its state is set from the event loop and read by gRPC threads.
        self.grpc = health.HealthServicer()

    @property
    def ready(self) -> bool:
        return self._audience_configured and bool(self._store)

    def reason(self) -> str | None:
        """None when ready, else the decision reason every request gets meanwhile."""
        if not self._audience_configured:
            return "not_configured"
        if not self._store:
            return "policy_unavailable"
        return None

    def state(self) -> tuple[str | None, dict[str, object]]:
        """What `/health/ready` answers: why not ready (or None), and the policy sets in force."""
        return self.reason(), {"policy_set_versions": self._store.versions()}

    def publish(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            self.grpc.set(name, status)


class AuthzCollector(Collector):
    """`/metrics`: readiness and the policy sets in force, read at scrape time (nothing on the Check path)."""

    def __init__(self, readiness: Readiness, store: PolicyStore) -> None:
        self._readiness = readiness
        self._store = store

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "stoa_authz_ready",
            "1 when requests can be decided (audience set, policy set loaded)",
            value=1 if self._readiness.ready else 0,
        )
        yield GaugeMetricFamily(
            "stoa_authz_policy_sets", "Policy-set versions kept decidable", value=len(self._store.versions())
        )


def authz_registry(readiness: Readiness, store: PolicyStore) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AuthzCollector(readiness, store))
    return registry
