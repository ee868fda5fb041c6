"""Typed dependencies of the routers: the database, what a write may need beyond it, and the
resources a path names that must exist (`require_*_exists`: 404 naming the field otherwise).
Credentials are checked in `stoa_cp.auth` (`require_gateway_credential`) and `stoa_cp.access`."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Path, Request

from stoa_cp.problems import not_found
from stoa_cp.store import gateways, tenants
from stoa_cp.store.database import Database
from stoa_cp.store.tenant_objects import Services


def database(request: Request) -> Database:
    return request.app.state.db  # type: ignore[no-any-return]


def services(request: Request) -> Services:
    return Services(request.app.state.settings, request.app.state.signer)


Db = Annotated[Database, Depends(database)]
AppServices = Annotated[Services, Depends(services)]


async def require_tenant_exists(tenant_id: Annotated[str, Path()], db: Db) -> str:
    """The tenant of the path (404 naming tenant_id when it does not exist)."""
    if not await tenants.exists(db, tenant_id):
        raise not_found("tenant_id", tenant_id)
    return tenant_id


async def require_gateway_exists(gateway_id: Annotated[str, Path()], db: Db) -> str:
    """The gateway of the path (404 naming gateway_id when it does not exist)."""
    if not await gateways.exists(db, gateway_id):
        raise not_found("gateway_id", gateway_id)
    return gateway_id


ExistingTenant = Annotated[str, Depends(require_tenant_exists)]
ExistingGateway = Annotated[str, Depends(require_gateway_exists)]
