"""Tenants."""

from __future__ import annotations

from stoa_cp.problems import conflict
from stoa_cp.schemas import TenantIn, TenantOut
from stoa_cp.store.database import Database


async def create(db: Database, body: TenantIn) -> tuple[TenantOut, bool]:
    """The tenant, and whether this call created it (an identical tenant is answered as it is)."""
    async with db.transaction() as conn:
        created = await conn.fetchval(
            "INSERT INTO tenants (tenant_id, name) VALUES ($1, $2) ON CONFLICT (tenant_id) DO NOTHING"
            " RETURNING 1",
            body.tenant_id,
            body.name,
        )
        if created is None:
            name = await conn.fetchval("SELECT name FROM tenants WHERE tenant_id = $1", body.tenant_id)
            if name != body.name:
                raise conflict("tenant_id", body.tenant_id)
    return TenantOut(tenant_id=body.tenant_id, name=body.name), created is not None


async def list_all(db: Database, only: str | None = None) -> list[TenantOut]:
    """Every tenant, or only the tenant `only`."""
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT tenant_id, name FROM tenants WHERE $1::text IS NULL OR tenant_id = $1 ORDER BY tenant_id",
            only,
        )
    return [TenantOut(**dict(row)) for row in rows]


async def exists(db: Database, tenant_id: str) -> bool:
    async with db.connection() as conn:
        return await conn.fetchval("SELECT 1 FROM tenants WHERE tenant_id = $1", tenant_id) is not None
