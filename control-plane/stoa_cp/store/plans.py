"""Plans of a tenant: requests per window, billed or not. A plan in use cannot be deleted (409)."""

from __future__ import annotations

import asyncpg

from stoa_cp.problems import Problem, conflict, not_found
from stoa_cp.schemas import PlanFields, PlanIn, PlanOut
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, lock_tenant, tenant_gateways

_SELECT = "SELECT plan_id, tenant_id, requests, window_seconds, billed FROM plans"


async def _read(conn: asyncpg.Connection, tenant_id: str, plan_id: str) -> PlanOut:
    row = await conn.fetchrow(f"{_SELECT} WHERE tenant_id = $1 AND plan_id = $2", tenant_id, plan_id)
    if row is None:
        raise not_found("plan_id", plan_id)
    return PlanOut(**dict(row))


async def create(db: Database, tenant_id: str, body: PlanIn) -> PlanOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        try:
            await conn.execute(
                "INSERT INTO plans (tenant_id, plan_id, requests, window_seconds, billed)"
                " VALUES ($1, $2, $3, $4, $5)",
                tenant_id,
                body.plan_id,
                body.requests,
                body.window_seconds,
                body.billed,
            )
        except asyncpg.UniqueViolationError:
            raise conflict("plan_id", body.plan_id) from None
        return await _read(conn, tenant_id, body.plan_id)


async def list_for(db: Database, tenant_id: str) -> list[PlanOut]:
    async with db.connection() as conn:
        rows = await conn.fetch(f"{_SELECT} WHERE tenant_id = $1 ORDER BY plan_id", tenant_id)
    return [PlanOut(**dict(row)) for row in rows]


async def get(db: Database, tenant_id: str, plan_id: str) -> PlanOut:
    async with db.connection() as conn:
        return await _read(conn, tenant_id, plan_id)


async def update(db: Database, tenant_id: str, plan_id: str, body: PlanFields) -> PlanOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        current = await _read(conn, tenant_id, plan_id)
        if PlanFields.model_validate(current.model_dump(include=set(PlanFields.model_fields))) == body:
            return current
        await conn.execute(
            "UPDATE plans SET requests = $3, window_seconds = $4, billed = $5"
            " WHERE tenant_id = $1 AND plan_id = $2",
            tenant_id,
            plan_id,
            body.requests,
            body.window_seconds,
            body.billed,
        )
        # Subscriptions carry their plan's figures to the site.
        await bump(conn, await tenant_gateways(conn, tenant_id))
        return await _read(conn, tenant_id, plan_id)


async def delete(db: Database, tenant_id: str, plan_id: str) -> None:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        await _read(conn, tenant_id, plan_id)
        user = await conn.fetchval(
            "SELECT subscription_id FROM subscriptions WHERE tenant_id = $1 AND plan_id = $2"
            " ORDER BY subscription_id LIMIT 1",
            tenant_id,
            plan_id,
        )
        if user is not None:
            raise Problem(
                409, "Conflict", [("plan_id", f"plan {plan_id!r} is in use by subscription {user!r}")]
            )
        await conn.execute("DELETE FROM plans WHERE tenant_id = $1 AND plan_id = $2", tenant_id, plan_id)
