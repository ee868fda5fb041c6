"""Consumers of a tenant, with the OAuth client ids that act for them. A change reaches every gateway
the tenant has routes on (the authorization policy set carries consumers): a new generation there."""

from __future__ import annotations

import asyncpg

from stoa_cp.problems import conflict
from stoa_cp.schemas import ConsumerFields, ConsumerOut
from stoa_cp.store.tenant_objects import Kind, Objects


async def _claim_client_ids(
    conn: asyncpg.Connection, tenant_id: str, consumer_id: str, body: ConsumerFields
) -> None:
    """Map each client id to this consumer (409 naming the first one another consumer holds)."""
    await conn.execute(
        "DELETE FROM consumer_client_ids WHERE tenant_id = $1 AND consumer_id = $2", tenant_id, consumer_id
    )
    held = await conn.fetchval(
        "SELECT client_id FROM consumer_client_ids WHERE tenant_id = $1 AND client_id = ANY($2::text[])"
        " ORDER BY client_id LIMIT 1",
        tenant_id,
        body.client_ids,
    )
    if held is not None:
        raise conflict("client_ids", held)
    await conn.execute(
        "INSERT INTO consumer_client_ids (tenant_id, client_id, consumer_id)"
        " SELECT $1, c, $2 FROM unnest($3::text[]) AS c",
        tenant_id,
        consumer_id,
        body.client_ids,
    )


async def _revoke_keys(conn: asyncpg.Connection, tenant_id: str, consumer_id: str) -> None:
    """A deleted consumer's keys are revoked (kept as revocations); its subscriptions go with it."""
    await conn.execute(
        "UPDATE api_keys SET revoked_at = now()"
        " WHERE tenant_id = $1 AND consumer_id = $2 AND revoked_at IS NULL",
        tenant_id,
        consumer_id,
    )


KIND = Kind(
    table="consumers",
    key="consumer_id",
    columns=("name", "client_ids"),
    model=ConsumerOut,
    written=_claim_client_ids,
    deleting=_revoke_keys,
)
objects = Objects(KIND)
