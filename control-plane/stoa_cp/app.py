"""The CP application: routers, error format, and the lifespan (pool + migrations, LISTEN, JWKS refresh)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from pathlib import Path

from fastapi import Depends, FastAPI, Request

from stoa_cp import openapi, permissions, problems, trust
from stoa_cp.access import Authentication, on_taken
from stoa_cp.events import InventoryEvents
from stoa_cp.principal import Authenticator
from stoa_cp.problems import Taken
from stoa_cp.request_body import BodyLimit
from stoa_cp.routers import (
    apis,
    audit,
    bulk,
    console,
    consumers,
    gateways,
    health,
    issuers,
    link,
    metrics,
    plans,
    policies,
    preview,
    subscriptions,
    tenants,
    tools,
)
from stoa_cp.schemas import unstorable
from stoa_cp.settings import Settings
from stoa_cp.store import policies as policy_store
from stoa_cp.store.changes import DeltaTracker
from stoa_cp.store.database import Bounds, Database
from stoa_cp.store.inventory import InventoryCache

log = logging.getLogger("stoa_cp")


async def storable_path(request: Request) -> None:
    """A path parameter PostgreSQL cannot hold (a NUL, say) is a 422 naming it, never a 500."""
    for name, value in request.path_params.items():
        found = unstorable(value, name)
        if found is not None:
            raise problems.invalid(*found)


def bounds(settings: Settings) -> Bounds:
    return Bounds(
        connect_s=settings.db_connect_timeout_s,
        acquire_s=settings.db_acquire_timeout_s,
        statement_s=settings.db_statement_timeout_s,
        transaction_s=settings.db_transaction_timeout_s,
        retry_after_s=settings.db_retry_after_s,
    )


def create_app(settings: Settings) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if not settings.admin_tokens and not settings.oidc_issuers:
            log.warning("no admin token and no trusted issuer: every request on the CP API will be refused")
        app.state.db = await Database.open(
            settings.database_url, settings.pool_min_size, settings.pool_max_size, bounds(settings)
        )
        # Policies stored before typed configs are re-read by the translator's rules (migration 0004).
        async with app.state.db.transaction() as conn:
            await policy_store.adopt_typed_configs(conn)
        app.state.events = InventoryEvents(settings.database_url)
        background: list[asyncio.Task[None]] = []
        try:
            await app.state.events.start()
            background.append(
                asyncio.create_task(
                    trust.refresh_forever(
                        app.state.db,
                        settings.jwks_refresh_s,
                        settings.jwks_fetch_timeout_s,
                        settings.issuer_stale_after_s,
                    ),
                    name="stoa-cp-jwks-refresh",
                )
            )
            if app.state.signer is not None:
                background.append(
                    asyncio.create_task(
                        permissions.keep_forever(
                            app.state.db,
                            app.state.signer,
                            app.state.events.any_change,
                            settings.mcp_permissions_check_s,
                        ),
                        name="stoa-cp-tool-permissions",
                    )
                )
            yield
        finally:
            for task in background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await app.state.events.stop()
            await app.state.db.close()

    app = FastAPI(
        title="STOA control plane",
        version="0.1.0",
        description="Tenants, APIs, gateways, policies and trusted issuers; publication over SSE.",
        lifespan=lifespan,
        dependencies=[Depends(storable_path)],
    )
    app.state.settings = settings
    app.state.signer = (
        permissions.Signer(
            Path(settings.mcp_signing_key_dir),
            settings.mcp_permissions_issuer,
            settings.mcp_permissions_lifetime_s,
        )
        if settings.mcp_signing_key_dir
        else None
    )
    app.state.inventory_cache = InventoryCache()
    app.state.metrics = metrics.Metrics()
    app.state.delta_tracker = DeltaTracker()
    problems.install(app)
    openapi.install(app, settings)
    app.add_exception_handler(Taken, on_taken)
    app.add_middleware(
        BodyLimit,
        default=(settings.max_body_bytes, "max_body_bytes"),
        larger=[
            (bulk.PATH.replace("{tenant_id}", "[^/]+"), settings.bulk_max_body_bytes, "bulk_max_body_bytes")
        ],
    )
    # Outermost: callers are authenticated before anything reads, limits or parses a body.
    app.add_middleware(Authentication, authenticator=Authenticator(settings))
    for module in (
        tenants,
        apis,
        bulk,
        consumers,
        plans,
        subscriptions,
        gateways,
        preview,
        issuers,
        link,
        health,
        metrics,
        audit,
        tools,
    ):
        app.include_router(module.router)
    app.include_router(tools.keys_router)
    app.include_router(policies.tenant_router)
    app.include_router(policies.gateway_router)
    app.include_router(console.router)
    app.mount("/console/static", console.static_files(), name="console-static")
    return app
