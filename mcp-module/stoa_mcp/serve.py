"""Wire the module together and run it: the MCP endpoint, the operator endpoint, the ADS stream."""

from __future__ import annotations

import asyncio
import contextlib
import logging

import aiohttp
import uvicorn
from mcp.server.transport_security import TransportSecuritySettings
from prometheus_client import CollectorRegistry
from stoa_ops.endpoint import OperatorEndpoint
from stoa_ops.lifecycle import stop_on_signals
from stoa_ops.policy_sets import PolicySubscription

from stoa_mcp.ads import subscribe
from stoa_mcp.budgets import Budgets
from stoa_mcp.call import upstream_session
from stoa_mcp.health import McpCollector, readiness
from stoa_mcp.identity import EnvelopeVerifier
from stoa_mcp.permissions import Permissions, load_pinned_keys
from stoa_mcp.server import McpModule
from stoa_mcp.settings import Settings

log = logging.getLogger("stoa_mcp")


def build(
    settings: Settings, budgets: Budgets | None = None
) -> tuple[McpModule, PolicySubscription, aiohttp.ClientSession]:
    assert settings.trusted_keys is not None
    permissions = Permissions(
        load_pinned_keys(settings.trusted_keys),
        settings.gateway_id,
        settings.permissions_issuer,
        settings.clock_skew_s,
    )
    http = upstream_session()
    verifier = EnvelopeVerifier(
        settings.envelope_jwks_url, settings.envelope_issuer, http, settings.clock_skew_s
    )
    security = (
        TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=settings.allowed_hosts,
            allowed_origins=settings.allowed_origins,
        )
        if settings.allowed_hosts
        else None
    )
    budgets = Budgets(settings.database_url)
    module = McpModule(permissions, verifier, http, settings.upstream_timeout_ms, budgets, security)
    subscription = subscribe(
        settings.ads_address,
        permissions,
        module.use_registry,
        settings.ads_credentials(),
        settings.ads_server_name,
    )
    return module, subscription, http


def _server(app: object, settings: Settings, name: str) -> uvicorn.Server:
    host, port = settings.address(name)
    # uvloop and httptools: the event loop and HTTP parser in C (h11 and asyncio's pure-Python loop
    # were a large part of a tools/call's time). Behind Envoy: no forwarded headers are read.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="auto",
        access_log=False,
        loop="none",
        http="httptools",
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    return server


async def serve(settings: Settings) -> None:
    module, subscription, http = build(settings)
    mcp = _server(module, settings, "mcp_address")
    registry = CollectorRegistry()
    registry.register(McpCollector(module))
    host, port = settings.address("http_address")
    ops = await OperatorEndpoint(lambda: readiness(module), registry).start(host, port)
    stop = asyncio.Event()
    stop_on_signals(stop)
    await module.verifier.refresh()
    module.call_log.start()
    ads_task = asyncio.create_task(subscription.run(), name="stoa-mcp-ads")
    servers = [asyncio.create_task(mcp.serve(), name="stoa-mcp-mcp")]
    log.info("started", extra={"mcp_address": settings.mcp_address, "http_address": settings.http_address})
    stopper = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([*servers, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if task is not stopper and task.exception() is not None:
                raise OSError(f"a listener stopped: {task.exception()!r}")
            if task is not stopper:
                raise OSError("a listener could not start")
    finally:
        mcp.should_exit = True
        ops.close()
        ads_task.cancel()
        stopper.cancel()
        with contextlib.suppress(asyncio.CancelledError, OSError, SystemExit):
            await asyncio.gather(*servers, ads_task, return_exceptions=True)
        try:
            await http.close()
        finally:
            module.call_log.close()  # every line written, whatever the close of the API client did
            if module.budgets is not None:
                module.budgets.close()
