"""Gateways: registration, credentials (stored as SHA-256 digests) and sync state."""

from __future__ import annotations

import logging

from stoa_cp.problems import conflict, not_found
from stoa_cp.schemas import GatewayCreated, GatewayIn, GatewayOut, GatewayStatus, InvalidPolicy, LastReport
from stoa_cp.store.database import Database
from stoa_cp.store.policies import invalid_reaching
from stoa_cp.store.publication import lock_gateway, notify

log = logging.getLogger("stoa_cp")


async def create(
    db: Database, body: GatewayIn, credential: str, credential_digest: bytes
) -> tuple[GatewayCreated, bool]:
    """Register a gateway at generation 1; an identical registration is answered as it stands, without
    a credential (only the answer that registered it shows one)."""
    async with db.transaction() as conn:
        created = await conn.fetchval(
            "INSERT INTO gateways (gateway_id, name, credential_sha256) VALUES ($1, $2, $3)"
            " ON CONFLICT (gateway_id) DO NOTHING RETURNING 1",
            body.gateway_id,
            body.name,
            credential_digest,
        )
        if created is None:
            row = await conn.fetchrow(
                "SELECT name, generation FROM gateways WHERE gateway_id = $1", body.gateway_id
            )
            if row is None or row["name"] != body.name:
                raise conflict("gateway_id", body.gateway_id)
            out = GatewayCreated(
                gateway_id=body.gateway_id, name=body.name, generation=row["generation"], credential=None
            )
            return out, False
        await notify(conn, {body.gateway_id: 1})
    return GatewayCreated(
        gateway_id=body.gateway_id, name=body.name, generation=1, credential=credential
    ), True


async def list_all(db: Database) -> list[GatewayOut]:
    async with db.connection() as conn:
        rows = await conn.fetch("SELECT gateway_id, name, generation FROM gateways ORDER BY gateway_id")
    return [GatewayOut(**dict(row)) for row in rows]


async def get(db: Database, gateway_id: str) -> GatewayOut:
    async with db.connection() as conn:
        row = await conn.fetchrow(
            "SELECT gateway_id, name, generation FROM gateways WHERE gateway_id = $1", gateway_id
        )
    if row is None:
        raise not_found("gateway_id", gateway_id)
    return GatewayOut(**dict(row))


async def exists(db: Database, gateway_id: str) -> bool:
    async with db.connection() as conn:
        return await conn.fetchval("SELECT 1 FROM gateways WHERE gateway_id = $1", gateway_id) is not None


async def credential_digest(db: Database, gateway_id: str) -> bytes | None:
    async with db.connection() as conn:
        stored = await conn.fetchval(
            "SELECT credential_sha256 FROM gateways WHERE gateway_id = $1", gateway_id
        )
    return None if stored is None else bytes(stored)


async def holder_of(db: Database, presented_digest: bytes) -> str | None:
    """The gateway whose credential has this digest (a lookup by the digest of a high-entropy secret
    reveals nothing usable about any credential)."""
    async with db.connection() as conn:
        found = await conn.fetchval(
            "SELECT gateway_id FROM gateways WHERE credential_sha256 = $1", presented_digest
        )
    return None if found is None else str(found)


async def move_above(db: Database, gateway_id: str, seen: int, source: str) -> int | None:
    """When the gateway's Link has seen a generation `seen` above the CP's own (the database
    was restored from a backup older than what the Link applied), move the gateway's generation to
    `seen + 1` in one transaction, so the next inventory is newer than the Link's and accepted. The
    new generation, or None when the CP's was already above."""
    async with db.connection() as conn:
        current = await conn.fetchval("SELECT generation FROM gateways WHERE gateway_id = $1", gateway_id)
    if current is None or seen <= current:
        return None  # the usual resume: nothing to write
    async with db.transaction() as conn:
        generation = await lock_gateway(conn, gateway_id)
        if seen <= generation:
            return None
        moved = seen + 1
        await conn.execute("UPDATE gateways SET generation = $2 WHERE gateway_id = $1", gateway_id, moved)
        await notify(conn, {gateway_id: moved})
    log.warning(
        "generation_moved gateway=%s from=%d to=%d reason=%s",
        gateway_id,
        generation,
        moved,
        f"the Link's {source} names generation {seen}, above the CP's {generation}: the database "
        "is older than what the Link applied (restored from a backup?)",
    )
    return moved


async def status(db: Database, gateway_id: str) -> GatewayStatus:
    """Sync state, always about the desired generation: a report for an older one never makes it SYNCED."""
    async with db.connection() as conn:
        row = await conn.fetchrow(
            "SELECT generation, acknowledged_generation, snapshot_version, failed_generation, last_report"
            " FROM gateways WHERE gateway_id = $1",
            gateway_id,
        )
        left_out = await invalid_reaching(conn, gateway_id)
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
        invalid_policies=[InvalidPolicy(policy_id=p, reason=r, tenant_id=t) for p, r, t in left_out],
    )
