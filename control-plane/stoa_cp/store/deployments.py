"""Deployments: which APIs are active on which gateway. Each change is a new generation of the gateway."""

from __future__ import annotations

import asyncpg

from stoa_cp.problems import not_found
from stoa_cp.schemas import DeploymentOut
from stoa_cp.store.database import Database
from stoa_cp.store.policies import refuse_overlaps
from stoa_cp.store.publication import bump, bury, lock_gateway, lock_tenant, unbury


async def list_for(db: Database, gateway_id: str, tenant_id: str | None = None) -> list[str]:
    """The APIs deployed on the gateway (of one tenant when `tenant_id` is given)."""
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT d.api_id FROM deployments d JOIN apis a ON a.api_id = d.api_id"
            " WHERE d.gateway_id = $1 AND ($2::text IS NULL OR a.tenant_id = $2) ORDER BY d.api_id",
            gateway_id,
            tenant_id,
        )
    return [row["api_id"] for row in rows]


async def _api_tenant(conn: asyncpg.Connection, api_id: str) -> str:
    tenant_id = await conn.fetchval("SELECT tenant_id FROM apis WHERE api_id = $1", api_id)
    if tenant_id is None:
        raise not_found("api_id", api_id)
    return str(tenant_id)


async def deploy(db: Database, gateway_id: str, api_id: str) -> DeploymentOut:
    """Activate an API on a gateway (deploying a deployed API changes nothing)."""
    async with db.transaction() as conn:
        await lock_tenant(conn, await _api_tenant(conn, api_id), "share")
        if await conn.fetchval("SELECT 1 FROM apis WHERE api_id = $1 FOR SHARE", api_id) is None:
            raise not_found("api_id", api_id)
        generation = await lock_gateway(conn, gateway_id)
        inserted = await conn.fetchval(
            "INSERT INTO deployments (gateway_id, api_id) VALUES ($1, $2) ON CONFLICT DO NOTHING RETURNING 1",
            gateway_id,
            api_id,
        )
        if inserted is None:
            return DeploymentOut(gateway_id=gateway_id, api_id=api_id, generation=generation, changed=False)
        await unbury(conn, gateway_id, [api_id])
        await refuse_overlaps(conn, [gateway_id], route_id=api_id)
        generation = (await bump(conn, [gateway_id]))[gateway_id]
    return DeploymentOut(gateway_id=gateway_id, api_id=api_id, generation=generation, changed=True)


async def undeploy(db: Database, gateway_id: str, api_id: str) -> DeploymentOut:
    """Deactivate an API on a gateway: the route leaves through a tombstone in a new generation."""
    async with db.transaction() as conn:
        await lock_tenant(conn, await _api_tenant(conn, api_id), "share")
        await lock_gateway(conn, gateway_id)
        deleted = await conn.fetchval(
            "DELETE FROM deployments WHERE gateway_id = $1 AND api_id = $2 RETURNING 1", gateway_id, api_id
        )
        if deleted is None:
            raise not_found("api_id", f"{api_id} (not deployed on {gateway_id})")
        bumped = await bump(conn, [gateway_id])
        await bury(conn, [api_id], bumped)
    return DeploymentOut(gateway_id=gateway_id, api_id=api_id, generation=bumped[gateway_id], changed=True)
