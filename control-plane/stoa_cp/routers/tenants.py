from __future__ import annotations

import asyncpg
from fastapi import APIRouter

from stoa_cp.auth import Admin, Db
from stoa_cp.problems import PROBLEM_RESPONSES, conflict
from stoa_cp.schemas import TenantIn, TenantOut

router = APIRouter(prefix="/v1/tenants", tags=["tenants"], dependencies=[Admin], responses=PROBLEM_RESPONSES)


@router.post("", status_code=201)
async def create_tenant(body: TenantIn, db: Db) -> TenantOut:
    try:
        await db.execute("INSERT INTO tenants (tenant_id, name) VALUES ($1, $2)", body.tenant_id, body.name)
    except asyncpg.UniqueViolationError:
        raise conflict("tenant_id", body.tenant_id) from None
    return TenantOut(tenant_id=body.tenant_id, name=body.name)


@router.get("")
async def list_tenants(db: Db) -> list[TenantOut]:
    rows = await db.fetch("SELECT tenant_id, name FROM tenants ORDER BY tenant_id")
    return [TenantOut(**dict(row)) for row in rows]
