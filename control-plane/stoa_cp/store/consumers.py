"""Consumers of a tenant, with the OAuth client ids that act for them. A change reaches every gateway
the tenant has routes on (the authorization policy set carries consumers): a new generation there."""

from __future__ import annotations

import asyncpg

from stoa_cp.problems import conflict, not_found
from stoa_cp.schemas import ConsumerFields, ConsumerIn, ConsumerOut
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, lock_tenant, tenant_gateways

_SELECT = "SELECT consumer_id, tenant_id, name, client_ids FROM consumers"


def _out(row: asyncpg.Record) -> ConsumerOut:
    return ConsumerOut(
        consumer_id=row["consumer_id"],
        tenant_id=row["tenant_id"],
        name=row["name"],
        client_ids=list(row["client_ids"]),
    )


async def _read(conn: asyncpg.Connection, tenant_id: str, consumer_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(f"{_SELECT} WHERE tenant_id = $1 AND consumer_id = $2", tenant_id, consumer_id)
    if row is None:
        raise not_found("consumer_id", consumer_id)
    return row


async def _claim_client_ids(
    conn: asyncpg.Connection, tenant_id: str, consumer_id: str, ids: list[str]
) -> None:
    """Map each client id to this consumer (409 naming the first one another consumer holds)."""
    await conn.execute(
        "DELETE FROM consumer_client_ids WHERE tenant_id = $1 AND consumer_id = $2", tenant_id, consumer_id
    )
    held = await conn.fetchval(
        "SELECT client_id FROM consumer_client_ids WHERE tenant_id = $1 AND client_id = ANY($2::text[])"
        " ORDER BY client_id LIMIT 1",
        tenant_id,
        ids,
    )
    if held is not None:
        raise conflict("client_ids", held)
    await conn.execute(
        "INSERT INTO consumer_client_ids (tenant_id, client_id, consumer_id)"
        " SELECT $1, c, $2 FROM unnest($3::text[]) AS c",
        tenant_id,
        consumer_id,
        ids,
    )


async def create(db: Database, tenant_id: str, body: ConsumerIn) -> ConsumerOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        try:
            await conn.execute(
                "INSERT INTO consumers (tenant_id, consumer_id, name, client_ids) VALUES ($1, $2, $3, $4)",
                tenant_id,
                body.consumer_id,
                body.name,
                body.client_ids,
            )
        except asyncpg.UniqueViolationError:
            raise conflict("consumer_id", body.consumer_id) from None
        await _claim_client_ids(conn, tenant_id, body.consumer_id, body.client_ids)
        await bump(conn, await tenant_gateways(conn, tenant_id))
        return _out(await _read(conn, tenant_id, body.consumer_id))


async def list_for(db: Database, tenant_id: str) -> list[ConsumerOut]:
    async with db.connection() as conn:
        rows = await conn.fetch(f"{_SELECT} WHERE tenant_id = $1 ORDER BY consumer_id", tenant_id)
    return [_out(row) for row in rows]


async def get(db: Database, tenant_id: str, consumer_id: str) -> ConsumerOut:
    async with db.connection() as conn:
        return _out(await _read(conn, tenant_id, consumer_id))


async def update(db: Database, tenant_id: str, consumer_id: str, body: ConsumerFields) -> ConsumerOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        current = await _read(conn, tenant_id, consumer_id)
        if current["name"] == body.name and list(current["client_ids"]) == body.client_ids:
            return _out(current)
        await conn.execute(
            "UPDATE consumers SET name = $3, client_ids = $4 WHERE tenant_id = $1 AND consumer_id = $2",
            tenant_id,
            consumer_id,
            body.name,
            body.client_ids,
        )
        await _claim_client_ids(conn, tenant_id, consumer_id, body.client_ids)
        await bump(conn, await tenant_gateways(conn, tenant_id))
        return _out(await _read(conn, tenant_id, consumer_id))


async def delete(db: Database, tenant_id: str, consumer_id: str) -> None:
    """Delete the consumer and its subscriptions; its keys are revoked (kept as revocations)."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        await _read(conn, tenant_id, consumer_id)
        await conn.execute(
            "UPDATE api_keys SET revoked_at = now()"
            " WHERE tenant_id = $1 AND consumer_id = $2 AND revoked_at IS NULL",
            tenant_id,
            consumer_id,
        )
        await conn.execute(
            "DELETE FROM consumers WHERE tenant_id = $1 AND consumer_id = $2", tenant_id, consumer_id
        )
        await bump(conn, await tenant_gateways(conn, tenant_id))
