from __future__ import annotations

import asyncpg
from fastapi import APIRouter

from stoa_cp.auth import Admin, Db, new_credential
from stoa_cp.problems import PROBLEM_RESPONSES, conflict, not_found
from stoa_cp.publish import bump, lock_gateway, lock_tenant, notify, require_gateway
from stoa_cp.schemas import DeploymentOut, GatewayCreated, GatewayIn, GatewayOut, GatewayStatus, LastReport

router = APIRouter(
    prefix="/v1/gateways", tags=["gateways"], dependencies=[Admin], responses=PROBLEM_RESPONSES
)


@router.post("", status_code=201)
async def create_gateway(body: GatewayIn, db: Db) -> GatewayCreated:
    """Register a gateway at generation 1; the credential is returned once and stored only hashed."""
    credential, credential_digest = new_credential()
    async with db.acquire() as conn, conn.transaction():
        try:
            await conn.execute(
                "INSERT INTO gateways (gateway_id, name, credential_sha256) VALUES ($1, $2, $3)",
                body.gateway_id,
                body.name,
                credential_digest,
            )
        except asyncpg.UniqueViolationError:
            raise conflict("gateway_id", body.gateway_id) from None
        await notify(conn, {body.gateway_id: 1})
    return GatewayCreated(gateway_id=body.gateway_id, name=body.name, generation=1, credential=credential)


@router.get("")
async def list_gateways(db: Db) -> list[GatewayOut]:
    rows = await db.fetch("SELECT gateway_id, name, generation FROM gateways ORDER BY gateway_id")
    return [GatewayOut(**dict(row)) for row in rows]


@router.get("/{gateway_id}")
async def get_gateway(gateway_id: str, db: Db) -> GatewayOut:
    row = await db.fetchrow(
        "SELECT gateway_id, name, generation FROM gateways WHERE gateway_id = $1", gateway_id
    )
    if row is None:
        raise not_found("gateway_id", gateway_id)
    return GatewayOut(**dict(row))


@router.get("/{gateway_id}/deployments")
async def list_deployments(gateway_id: str, db: Db) -> list[str]:
    async with db.acquire() as conn:
        await require_gateway(conn, gateway_id)
        rows = await conn.fetch(
            "SELECT api_id FROM deployments WHERE gateway_id = $1 ORDER BY api_id", gateway_id
        )
    return [row["api_id"] for row in rows]


async def _api_tenant(conn: asyncpg.Connection, api_id: str) -> str:
    tenant_id = await conn.fetchval("SELECT tenant_id FROM apis WHERE api_id = $1", api_id)
    if tenant_id is None:
        raise not_found("api_id", api_id)
    return str(tenant_id)


@router.put("/{gateway_id}/deployments/{api_id}")
async def deploy(gateway_id: str, api_id: str, db: Db) -> DeploymentOut:
    """Activate an API on a gateway (idempotent: deploying a deployed API changes nothing)."""
    async with db.acquire() as conn, conn.transaction():
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
        # A re-deploy removes the tombstone of an earlier deactivation.
        await conn.execute(
            "DELETE FROM tombstones WHERE gateway_id = $1 AND route_id = $2", gateway_id, api_id
        )
        generation = (await bump(conn, [gateway_id]))[gateway_id]
    return DeploymentOut(gateway_id=gateway_id, api_id=api_id, generation=generation, changed=True)


@router.delete("/{gateway_id}/deployments/{api_id}")
async def undeploy(gateway_id: str, api_id: str, db: Db) -> DeploymentOut:
    """Deactivate an API on a gateway: the route leaves through a tombstone in a new generation."""
    async with db.acquire() as conn, conn.transaction():
        await lock_tenant(conn, await _api_tenant(conn, api_id), "share")
        await lock_gateway(conn, gateway_id)
        deleted = await conn.fetchval(
            "DELETE FROM deployments WHERE gateway_id = $1 AND api_id = $2 RETURNING 1", gateway_id, api_id
        )
        if deleted is None:
            raise not_found("api_id", f"{api_id} (not deployed on {gateway_id})")
        generation = (await bump(conn, [gateway_id]))[gateway_id]
        await conn.execute(
            "INSERT INTO tombstones (gateway_id, route_id, generation) VALUES ($1, $2, $3)"
            " ON CONFLICT (gateway_id, route_id) DO UPDATE SET generation = EXCLUDED.generation",
            gateway_id,
            api_id,
            generation,
        )
    return DeploymentOut(gateway_id=gateway_id, api_id=api_id, generation=generation, changed=True)


@router.get("/{gateway_id}/status")
async def gateway_status(gateway_id: str, db: Db) -> GatewayStatus:
    """Sync state, always about the desired generation: a report for an older one never makes it SYNCED."""
    row = await db.fetchrow(
        "SELECT generation, acknowledged_generation, snapshot_version, failed_generation, last_report"
        " FROM gateways WHERE gateway_id = $1",
        gateway_id,
    )
    if row is None:
        raise not_found("gateway_id", gateway_id)
    desired = int(row["generation"])
    if row["acknowledged_generation"] >= desired:
        state = "SYNCED"
    elif row["failed_generation"] >= desired:
        state = "FAILED"
    else:
        state = "PENDING"
    last = row["last_report"]
    return GatewayStatus(
        gateway_id=gateway_id,
        desired_generation=desired,
        acknowledged_generation=int(row["acknowledged_generation"]),
        snapshot_version=row["snapshot_version"],
        state=state,
        last_report=LastReport(**last) if last else None,
    )
