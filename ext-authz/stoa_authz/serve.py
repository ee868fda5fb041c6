"""One service process: gRPC Check + health, the HTTP endpoints, and the ADS subscription.

Checks run on grpcio's synchronous server (a small thread pool: decisions are CPU-bound and short;
grpcio's asyncio server costs about twice the CPU per unary call). The ADS subscription, the HTTP
endpoints and signal handling run on the asyncio loop of the main thread.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent import futures
from dataclasses import dataclass

import grpc
from envoy.service.auth.v3 import external_auth_pb2_grpc
from grpc_health.v1 import health_pb2_grpc
from stoa_ops.endpoint import OperatorEndpoint
from stoa_ops.lifecycle import run_until_stopped, stop_on_signals
from stoa_quota import BatchedCounter, BilledCounter, DegradedMode, QuotaStore

from stoa_authz.ads import subscribe
from stoa_authz.check import AuthorizationService, Decider, DecisionConfig
from stoa_authz.envelope import Envelope
from stoa_authz.health import Readiness, authz_registry
from stoa_authz.identify import Identifier
from stoa_authz.log import DecisionLog
from stoa_authz.policy import PolicyStore
from stoa_authz.quotas import Quotas
from stoa_authz.settings import Settings

log = logging.getLogger("stoa_authz.serve")


def grpc_server(settings: Settings) -> grpc.Server:
    options = [
        # Worker processes share the port; the kernel spreads connections over them.
        ("grpc.so_reuseport", 1 if settings.reuse_port else 0),
        # Envoy multiplexes Checks over few HTTP/2 connections: bound the streams per connection
        # so a burst queues in Envoy (which applies its own timeout) instead of in this process.
        ("grpc.max_concurrent_streams", settings.grpc_max_concurrent_streams),
    ]
    return grpc.server(
        futures.ThreadPoolExecutor(max_workers=settings.grpc_threads, thread_name_prefix="check"),
        options=options,
    )


@dataclass
class QuotaCounters:
    quotas: Quotas
    store: QuotaStore | None = None
    batched: BatchedCounter | None = None

    def close(self) -> None:
        if self.batched is not None:
            self.batched.close()  # its last counts are flushed
        if self.store is not None:
            self.store.close()


def quota_counters(settings: Settings) -> QuotaCounters:
    """The quota counters on the configured PostgreSQL; the pool connects in the background, so a
    database that is down at start-up delays nothing (billed requests are quota_unavailable)."""
    if not settings.database_url:
        return QuotaCounters(Quotas())
    store = QuotaStore(
        settings.database_url, max_size=settings.grpc_threads, timeout_s=settings.quota_timeout_s
    ).open(wait_s=None)
    degraded = DegradedMode(settings.quota_degraded_overshoot, settings.quota_degraded_max_s)
    batched = BatchedCounter(store, settings.quota_flush_interval_s, degraded).start()
    return QuotaCounters(Quotas(BilledCounter(store), batched), store, batched)


async def serve(settings: Settings, envelope: Envelope, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    stop_on_signals(stop)

    store = PolicyStore(keep=settings.policy_sets_kept)
    readiness = Readiness(bool(settings.audience), store)
    store.on_change = readiness.publish
    identifier = Identifier(
        settings.audience,
        settings.tenant_claim,
        fetch_timeout_s=settings.jwks_fetch_timeout_s,
        max_lifetime_s=settings.max_token_lifetime_s,
    )
    config = DecisionConfig(
        settings.audience, frozenset(settings.required_scopes), cache_size=settings.token_cache_size
    )
    decision_log = DecisionLog().start()
    counters = quota_counters(settings)
    decider = Decider(config, store, identifier, envelope, decision_log, counters.quotas)

    server = grpc_server(settings)
    external_auth_pb2_grpc.add_AuthorizationServicer_to_server(AuthorizationService(decider), server)
    health_pb2_grpc.add_HealthServicer_to_server(readiness.grpc, server)
    if not server.add_insecure_port(settings.grpc_address):
        raise OSError(f"cannot bind gRPC address {settings.grpc_address}")
    readiness.publish()
    server.start()
    try:
        host, port = settings.address("http_address")
        endpoint = OperatorEndpoint(
            readiness.state,
            authz_registry(readiness, store),
            {"/.well-known/jwks.json": ("application/json", envelope.jwks)},
        )
        http = await endpoint.start(host, port, settings.reuse_port)
        subscription = subscribe(
            settings.ads_address, store, settings.ads_credentials(), settings.ads_server_name
        )
        started = {
            "grpc_address": settings.grpc_address,
            "http_address": settings.http_address,
            "kid": envelope.kid,
        }
        await run_until_stopped(stop, subscription, http, log, started)
    finally:
        try:
            await asyncio.to_thread(server.stop(grace=1).wait)
        finally:
            # After the last Check: every decision's event is written before the process exits.
            decision_log.close()
            counters.close()
