"""Typed dependencies of the routers: the database, and the resources a path names that must exist
(404 naming the field otherwise). Credentials are checked in `stoa_cp.auth`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request
from stoa_translate.policies import ListLimits

from stoa_cp.problems import not_found
from stoa_cp.settings import Settings
from stoa_cp.store import gateways, tenants
from stoa_cp.store.database import Database


def database(request: Request) -> Database:
    return request.app.state.db  # type: ignore[no-any-return]


Db = Annotated[Database, Depends(database)]


async def existing_tenant(tenant_id: Annotated[str, Path()], db: Db) -> str:
    """The tenant of the path (404 naming tenant_id when it does not exist)."""
    if not await tenants.exists(db, tenant_id):
        raise not_found("tenant_id", tenant_id)
    return tenant_id


async def existing_gateway(gateway_id: Annotated[str, Path()], db: Db) -> str:
    """The gateway of the path (404 naming gateway_id when it does not exist)."""
    if not await gateways.exists(db, gateway_id):
        raise not_found("gateway_id", gateway_id)
    return gateway_id


def limits_of(settings: Settings) -> ListLimits:
    """How many entries a policy's lists may hold, from the settings."""
    return ListLimits(
        origins=settings.policy_max_origins,
        headers=settings.policy_max_headers,
        addresses=settings.policy_max_addresses,
        patterns=settings.policy_max_patterns,
        entries=settings.policy_max_entries,
    )


def policy_limits(request: Request) -> ListLimits:
    return limits_of(request.app.state.settings)


ExistingTenant = Annotated[str, Depends(existing_tenant)]
ExistingGateway = Annotated[str, Depends(existing_gateway)]
PolicyLimits = Annotated[ListLimits, Depends(policy_limits)]
