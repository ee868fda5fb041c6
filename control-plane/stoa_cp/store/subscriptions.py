"""Subscriptions: a consumer's access to one API of its tenant under a plan, active or suspended
(a PUT sets the state only)."""

from __future__ import annotations

from typing import Any

import asyncpg

from stoa_cp.problems import not_found
from stoa_cp.schemas import SubscriptionIn, SubscriptionOut
from stoa_cp.store.tenant_objects import Kind, Objects, Values

# Each reference is checked within the tenant: another tenant's objects are unknown here.
_REFERENCES = (
    ("consumer_id", "SELECT 1 FROM consumers WHERE tenant_id = $1 AND consumer_id = $2"),
    ("api_id", "SELECT 1 FROM apis WHERE tenant_id = $1 AND api_id = $2"),
    ("plan_id", "SELECT 1 FROM plans WHERE tenant_id = $1 AND plan_id = $2"),
)


async def _references(conn: asyncpg.Connection, tenant_id: str, body: Any) -> Values:
    if isinstance(body, SubscriptionIn):
        for field, sql in _REFERENCES:
            value = getattr(body, field)
            if await conn.fetchval(sql, tenant_id, value) is None:
                raise not_found(field, value)
    return {}


KIND = Kind(
    table="subscriptions",
    key="subscription_id",
    columns=("consumer_id", "api_id", "plan_id", "state"),
    model=SubscriptionOut,
    check=_references,
    # A consumer subscribes once to an API.
    clash_field="api_id",
)
objects = Objects(KIND)
