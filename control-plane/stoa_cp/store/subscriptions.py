"""Subscriptions: a consumer's access to one API of its tenant under a plan, active or suspended."""

from __future__ import annotations

import asyncpg

from stoa_cp.problems import conflict, not_found
from stoa_cp.schemas import SubscriptionIn, SubscriptionOut
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, lock_tenant, tenant_gateways

_SELECT = "SELECT subscription_id, tenant_id, consumer_id, api_id, plan_id, state FROM subscriptions"


async def _read(conn: asyncpg.Connection, tenant_id: str, subscription_id: str) -> SubscriptionOut:
    row = await conn.fetchrow(
        f"{_SELECT} WHERE tenant_id = $1 AND subscription_id = $2", tenant_id, subscription_id
    )
    if row is None:
        raise not_found("subscription_id", subscription_id)
    return SubscriptionOut(**dict(row))


async def create(db: Database, tenant_id: str, body: SubscriptionIn) -> SubscriptionOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        # Each reference is checked within the tenant: another tenant's objects are unknown here.
        checks = (
            (
                "consumer_id",
                body.consumer_id,
                "SELECT 1 FROM consumers WHERE tenant_id = $1 AND consumer_id = $2",
            ),
            ("api_id", body.api_id, "SELECT 1 FROM apis WHERE tenant_id = $1 AND api_id = $2"),
            ("plan_id", body.plan_id, "SELECT 1 FROM plans WHERE tenant_id = $1 AND plan_id = $2"),
        )
        for field, value, sql in checks:
            if await conn.fetchval(sql, tenant_id, value) is None:
                raise not_found(field, value)
        try:
            await conn.execute(
                "INSERT INTO subscriptions (tenant_id, subscription_id, consumer_id, api_id, plan_id)"
                " VALUES ($1, $2, $3, $4, $5)",
                tenant_id,
                body.subscription_id,
                body.consumer_id,
                body.api_id,
                body.plan_id,
            )
        except asyncpg.UniqueViolationError as exc:
            if exc.constraint_name == "subscriptions_pkey":
                raise conflict("subscription_id", body.subscription_id) from None
            raise conflict("api_id", body.api_id) from None
        await bump(conn, await tenant_gateways(conn, tenant_id))
        return await _read(conn, tenant_id, body.subscription_id)


async def list_for(db: Database, tenant_id: str) -> list[SubscriptionOut]:
    async with db.connection() as conn:
        rows = await conn.fetch(f"{_SELECT} WHERE tenant_id = $1 ORDER BY subscription_id", tenant_id)
    return [SubscriptionOut(**dict(row)) for row in rows]


async def get(db: Database, tenant_id: str, subscription_id: str) -> SubscriptionOut:
    async with db.connection() as conn:
        return await _read(conn, tenant_id, subscription_id)


async def set_state(db: Database, tenant_id: str, subscription_id: str, state: str) -> SubscriptionOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        current = await _read(conn, tenant_id, subscription_id)
        if current.state == state:
            return current
        await conn.execute(
            "UPDATE subscriptions SET state = $3 WHERE tenant_id = $1 AND subscription_id = $2",
            tenant_id,
            subscription_id,
            state,
        )
        await bump(conn, await tenant_gateways(conn, tenant_id))
        return await _read(conn, tenant_id, subscription_id)


async def delete(db: Database, tenant_id: str, subscription_id: str) -> None:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        await _read(conn, tenant_id, subscription_id)
        await conn.execute(
            "DELETE FROM subscriptions WHERE tenant_id = $1 AND subscription_id = $2",
            tenant_id,
            subscription_id,
        )
        await bump(conn, await tenant_gateways(conn, tenant_id))
