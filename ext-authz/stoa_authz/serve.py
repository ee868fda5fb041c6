"""One service process: gRPC Check + health, the HTTP endpoints, and the ADS subscription."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal

import grpc
from envoy.service.auth.v3 import external_auth_pb2_grpc
from grpc_health.v1 import health_pb2_grpc

from stoa_authz.ads import PolicySubscription, channel_credentials
from stoa_authz.check import AuthorizationService, Decider, DecisionConfig
from stoa_authz.envelope import Envelope
from stoa_authz.health import HttpEndpoints, Readiness
from stoa_authz.identify import Identifier
from stoa_authz.policy import PolicyStore
from stoa_authz.settings import Settings, split_address

log = logging.getLogger("stoa_authz.serve")


async def serve(settings: Settings, envelope: Envelope, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    pending_publish: set[asyncio.Task[None]] = set()
    store = PolicyStore(keep=settings.policy_sets_kept)
    readiness = Readiness(bool(settings.audience), store)

    def on_change() -> None:
        task = loop.create_task(readiness.publish())
        pending_publish.add(task)
        task.add_done_callback(pending_publish.discard)

    store.on_change = on_change
    identifier = Identifier(
        settings.audience,
        settings.tenant_claim,
        cache_size=settings.token_cache_size,
        fetch_timeout_s=settings.jwks_fetch_timeout_s,
    )
    decider = Decider(
        DecisionConfig(settings.audience, frozenset(settings.required_scopes)), store, identifier, envelope
    )

    server = grpc.aio.server(options=[("grpc.so_reuseport", 1 if settings.reuse_port else 0)])
    external_auth_pb2_grpc.add_AuthorizationServicer_to_server(AuthorizationService(decider), server)
    health_pb2_grpc.add_HealthServicer_to_server(readiness.grpc, server)
    if not server.add_insecure_port(settings.grpc_address):
        raise OSError(f"cannot bind gRPC address {settings.grpc_address}")
    await readiness.publish()
    await server.start()

    host, port = split_address(settings.http_address)
    http = await HttpEndpoints(readiness, envelope.jwks).start(host, port, settings.reuse_port)

    credentials = None
    if settings.tls_files:
        ca, cert, key = (path.read_bytes() for path in settings.tls_files)
        credentials = channel_credentials(ca, cert, key)
    subscription = PolicySubscription(settings.ads_address, store, credentials, settings.ads_server_name)
    ads_task = loop.create_task(subscription.run())
    log.info(
        "started",
        extra={
            "grpc_address": settings.grpc_address,
            "http_address": settings.http_address,
            "kid": envelope.kid,
        },
    )
    try:
        await stop.wait()
    finally:
        ads_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ads_task
        http.close()
        await http.wait_closed()
        await server.stop(grace=1)
