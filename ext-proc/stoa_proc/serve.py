"""One service process: the gRPC ExternalProcessor + health, the HTTP endpoints, the ADS subscription.

grpcio's asyncio server: an ext_proc stream lives as long as its HTTP exchange (a streamed completion
for many seconds), so a thread per stream, as the synchronous server would hold, does not fit.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from grpc_health.v1 import health_pb2_grpc
from stoa_ops.endpoint import OperatorEndpoint
from stoa_ops.lifecycle import run_until_stopped, stop_on_signals
from stoa_quota import QuotaStore, TokenCounter

from stoa_proc.ads import subscribe
from stoa_proc.budget import Budgets
from stoa_proc.health import ProcCollector, Readiness
from stoa_proc.log import DecisionLog
from stoa_proc.policy import PolicyStore
from stoa_proc.process import ProcessingService
from stoa_proc.settings import Settings

log = logging.getLogger("stoa_proc.serve")


async def serve(settings: Settings, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    stop_on_signals(stop)

    store = PolicyStore(keep=settings.policy_sets_kept)
    readiness = Readiness(store)
    decisions = DecisionLog().start()
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", 2 * settings.max_body_bytes + 65536)]
    )
    quota_store = None
    if settings.database_url:
        # Connects in the background: a database down at start-up delays nothing (budgets fail).
        quota_store = QuotaStore(
            settings.database_url, max_size=settings.quota_pool_size, timeout_s=settings.quota_timeout_s
        ).open(wait_s=None)
    budgets = Budgets(TokenCounter(quota_store) if quota_store else None, settings.budget_degraded_s)
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(
        ProcessingService(store, decisions, settings.max_inflate_ratio, settings.max_body_bytes, budgets),
        server,
    )
    health_pb2_grpc.add_HealthServicer_to_server(readiness.grpc, server)
    if not server.add_insecure_port(settings.grpc_address):
        raise OSError(f"cannot bind gRPC address {settings.grpc_address}")
    await readiness.publish()
    await server.start()
    try:
        host, port = settings.address("http_address")
        decisions.registry.register(ProcCollector(store))
        http = await OperatorEndpoint(readiness.state, decisions.registry).start(host, port)
        subscription = subscribe(
            settings.ads_address,
            store,
            settings.max_body_bytes,
            settings.ads_credentials(),
            settings.ads_server_name,
            on_change=readiness.publish,
        )
        started = {"grpc_address": settings.grpc_address, "http_address": settings.http_address}
        await run_until_stopped(stop, subscription, http, log, started)
    finally:
        try:
            await server.stop(grace=1)
        finally:
            decisions.close()  # after the last exchange: every event is written
            if quota_store is not None:
                quota_store.close()
