"""Plans of a tenant: requests per window, billed or not. A plan in use cannot be deleted (409)."""

from __future__ import annotations

import asyncpg

from stoa_cp.problems import Problem
from stoa_cp.schemas import PlanOut
from stoa_cp.store.tenant_objects import GENERATION, NOTHING, Kind, Objects


async def _unused(conn: asyncpg.Connection, tenant_id: str, plan_id: str) -> None:
    user = await conn.fetchval(
        "SELECT subscription_id FROM subscriptions WHERE tenant_id = $1 AND plan_id = $2"
        " ORDER BY subscription_id LIMIT 1",
        tenant_id,
        plan_id,
    )
    if user is not None:
        raise Problem(409, "Conflict", [("plan_id", f"plan {plan_id!r} is in use by subscription {user!r}")])


KIND = Kind(
    table="plans",
    key="plan_id",
    columns=("requests", "window_seconds", "billed"),
    model=PlanOut,
    # Subscriptions carry their plan's figures to the site: only a change of a plan in use reaches it.
    reach=GENERATION,
    created_reach=NOTHING,
    deleted_reach=NOTHING,
    deleting=_unused,
)
objects = Objects(KIND)
