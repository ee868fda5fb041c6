"""MCP tools of a tenant, their grants and revocations (tenant-scoped, audited like every write)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request, Response

from stoa_cp.access import AnyCaller, TenantScope
from stoa_cp.dependencies import Db, ExistingTenant
from stoa_cp.permissions import Signer
from stoa_cp.problems import PROBLEM_RESPONSES, Problem
from stoa_cp.schemas import (
    ToolGrantIn,
    ToolGrantOut,
    ToolIn,
    ToolOut,
    ToolRevocationIn,
    ToolRevocationOut,
    ToolUpdate,
)
from stoa_cp.store import tools

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}",
    tags=["mcp tools"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)
keys_router = APIRouter(tags=["mcp tools"], responses=PROBLEM_RESPONSES)


def _signer(request: Request) -> Signer | None:
    return request.app.state.signer  # type: ignore[no-any-return]


@router.post("/tools", status_code=201)
async def create_tool(tenant_id: str, body: ToolIn, db: Db) -> ToolOut:
    """A tool: one operation (`method`, `path_template`) of one of the tenant's HTTP APIs."""
    return await tools.create(db, tenant_id, body.name, body)


@router.get("/tools")
async def list_tools(tenant_id: ExistingTenant, db: Db) -> list[ToolOut]:
    return await tools.list_for(db, tenant_id)


@router.get("/tools/{name}")
async def get_tool(tenant_id: ExistingTenant, name: str, db: Db) -> ToolOut:
    return await tools.get(db, tenant_id, name)


@router.put("/tools/{name}")
async def update_tool(tenant_id: str, name: str, body: ToolUpdate, db: Db) -> ToolOut:
    """PUT replaces the tool; the name is the path's."""
    return await tools.update(db, tenant_id, name, body)


@router.delete("/tools/{name}", status_code=204)
async def delete_tool(tenant_id: str, name: str, request: Request, db: Db) -> Response:
    """Delete the tool and its grants."""
    await tools.delete(db, tenant_id, name, _signer(request))
    return Response(status_code=204)


@router.post("/tool-grants", status_code=201)
async def create_grant(tenant_id: str, body: ToolGrantIn, request: Request, db: Db) -> ToolGrantOut:
    """Grant the tool to the listed consumers and to any caller holding one of the scopes."""
    return await tools.create_grant(db, tenant_id, body, _signer(request))


@router.get("/tool-grants")
async def list_grants(tenant_id: ExistingTenant, db: Db) -> list[ToolGrantOut]:
    return await tools.list_grants(db, tenant_id)


@router.delete("/tool-grants/{grant_id}", status_code=204)
async def delete_grant(tenant_id: str, grant_id: str, request: Request, db: Db) -> Response:
    await tools.delete_grant(db, tenant_id, grant_id, _signer(request))
    return Response(status_code=204)


@router.post("/tool-revocations", status_code=201)
async def create_revocation(
    tenant_id: str, body: ToolRevocationIn, request: Request, db: Db
) -> ToolRevocationOut:
    """Revoke the tool for one consumer (or for everyone without `consumer`), over any grant."""
    return await tools.create_revocation(db, tenant_id, body, _signer(request))


@router.get("/tool-revocations")
async def list_revocations(tenant_id: ExistingTenant, db: Db) -> list[ToolRevocationOut]:
    return await tools.list_revocations(db, tenant_id)


@router.delete("/tool-revocations/{revocation_id}", status_code=204)
async def delete_revocation(tenant_id: str, revocation_id: str, request: Request, db: Db) -> Response:
    """Lift the revocation."""
    await tools.delete_revocation(db, tenant_id, revocation_id, _signer(request))
    return Response(status_code=204)


@keys_router.get("/v1/tool-permissions/keys", dependencies=[AnyCaller])
async def signing_keys(request: Request) -> dict[str, Any]:
    """The public keys that sign tool permissions (a JWKS), for the sites to pin by kid."""
    signer = _signer(request)
    if signer is None:
        raise Problem(404, "Not found", [("keys", "this CP signs no tool permissions (no signing key)")])
    return signer.jwks()
