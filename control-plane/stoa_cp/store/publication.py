"""Publication: every change of a gateway's desired state bumps its generation in the same
transaction as the change, and notifies every CP process (LISTEN/NOTIFY) when it commits.

Lock order, shared by every writer so that concurrent changes serialise without deadlock:
tenant row → API row → gateway rows (sorted by id). Tenant-wide changes (policies, issuers) take the
tenant row FOR UPDATE; deployments and API edits take it FOR SHARE. That way the set of gateways a
tenant-wide change reaches cannot move under it. API creation and bulk publication take it FOR UPDATE
too: the number of APIs of a tenant is bounded, and two creations must not both take the last place.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

import asyncpg

from stoa_cp import audit
from stoa_cp.problems import not_found
from stoa_cp.store import changes

CHANNEL = "stoa_inventory"


async def lock_tenant(conn: asyncpg.Connection, tenant_id: str, mode: Literal["share", "update"]) -> None:
    """Lock the tenant row (404 naming tenant_id when it does not exist)."""
    clause = "FOR SHARE" if mode == "share" else "FOR UPDATE"
    found = await conn.fetchval(f"SELECT 1 FROM tenants WHERE tenant_id = $1 {clause}", tenant_id)  # noqa: S608
    if found is None:
        raise not_found("tenant_id", tenant_id)


async def tenant_gateways(conn: asyncpg.Connection, tenant_id: str) -> list[str]:
    """Gateways on which the tenant has at least one route: the reach of its policies and issuers."""
    rows = await conn.fetch(
        "SELECT DISTINCT d.gateway_id FROM deployments d JOIN apis a ON a.api_id = d.api_id"
        " WHERE a.tenant_id = $1 ORDER BY 1",
        tenant_id,
    )
    return [row["gateway_id"] for row in rows]


async def lock_gateway(conn: asyncpg.Connection, gateway_id: str) -> int:
    """Lock one gateway row and return its generation (404 naming gateway_id when unknown)."""
    generation = await conn.fetchval(
        "SELECT generation FROM gateways WHERE gateway_id = $1 FOR UPDATE", gateway_id
    )
    if generation is None:
        raise not_found("gateway_id", gateway_id)
    return int(generation)


async def bump(conn: asyncpg.Connection, gateway_ids: Iterable[str]) -> dict[str, int]:
    """Increment each gateway's generation once and queue a notification for commit time.

    Must run inside the transaction that makes the change; NOTIFY is delivered only on commit.
    """
    ids = sorted(set(gateway_ids))
    if not ids:
        return {}
    rows = await conn.fetch(
        """
        WITH locked AS (
            SELECT gateway_id FROM gateways WHERE gateway_id = ANY($1::text[])
            ORDER BY gateway_id FOR UPDATE
        )
        UPDATE gateways g SET generation = g.generation + 1
        FROM locked WHERE g.gateway_id = locked.gateway_id
        RETURNING g.gateway_id, g.generation
        """,
        ids,
    )
    bumped = {row["gateway_id"]: int(row["generation"]) for row in rows}
    await changes.prune(conn)
    await notify(conn, bumped)
    return bumped


async def notify(conn: asyncpg.Connection, generations: dict[str, int]) -> None:
    audit.note_generations(generations)
    if generations:
        await conn.execute(
            "SELECT pg_notify($1, payload) FROM unnest($2::text[]) AS payload",
            CHANNEL,
            [f"{gateway_id}:{generation}" for gateway_id, generation in generations.items()],
        )


async def bury(conn: asyncpg.Connection, route_ids: list[str], generations: dict[str, int]) -> None:
    """Tombstone the routes on each gateway at that gateway's new generation: the Link removes them."""
    await conn.execute(
        "INSERT INTO tombstones (gateway_id, route_id, generation)"
        " SELECT g, r, gen FROM unnest($2::text[], $3::bigint[]) AS t(g, gen), unnest($1::text[]) AS r"
        " ON CONFLICT (gateway_id, route_id) DO UPDATE SET generation = EXCLUDED.generation",
        route_ids,
        list(generations),
        list(generations.values()),
    )


async def unbury(conn: asyncpg.Connection, gateway_id: str, route_ids: list[str]) -> None:
    """A re-deploy removes the tombstone of an earlier deactivation."""
    await conn.execute(
        "DELETE FROM tombstones WHERE gateway_id = $1 AND route_id = ANY($2::text[])", gateway_id, route_ids
    )


def parse_payload(payload: str) -> tuple[str, int] | None:
    gateway_id, _, generation = payload.rpartition(":")
    if not gateway_id or not generation.isdigit():
        return None
    return gateway_id, int(generation)


async def listen(
    dsn: str,
    name: str,
    on_notify: Callable[[str, int], None],
    also: Mapping[str, Callable[[str], None]] | None = None,
) -> asyncpg.Connection:
    """A connection of its own (named `name` in pg_stat_activity) listening for committed changes:
    `on_notify(gateway_id, generation)` for each; `also`: other channels, each callback given the
    payload. The caller closes it."""

    def notified(_conn: object, _pid: int, _channel: str, payload: object) -> None:
        parsed = parse_payload(str(payload))
        if parsed is not None:
            on_notify(*parsed)

    def relay(callback: Callable[[str], None]) -> Callable[[object, int, str, object], None]:
        return lambda _conn, _pid, _channel, payload: callback(str(payload))

    conn = await asyncpg.connect(dsn, server_settings={"application_name": name})
    try:
        await conn.add_listener(CHANNEL, notified)
        for channel, callback in (also or {}).items():
            await conn.add_listener(channel, relay(callback))
    except BaseException:
        await conn.close()
        raise
    return conn


async def still_listening(conn: asyncpg.Connection, timeout_s: float) -> None:
    """Raises when the listening connection no longer answers within `timeout_s` (it is then lost)."""
    await asyncio.wait_for(conn.execute("SELECT 1"), timeout=timeout_s)
