"""Bulk publication: many APIs and deployments of one tenant in one transaction, and so one new
generation per gateway it changes. Each item obeys the rules of the single calls; any refusal stores
nothing."""

from __future__ import annotations

import logging

import asyncpg

from stoa_cp.problems import Problem, Taken
from stoa_cp.schemas import BulkIn, BulkOut
from stoa_cp.store import apis, tools
from stoa_cp.store.database import ClientGone, Database, DatabaseUnavailable
from stoa_cp.store.publication import bump, bury, lock_tenant, tenant_gateways, unbury
from stoa_cp.store.tenant_objects import same

# A bulk publication writing at least this many rows (APIs, deployments) analyzes the tables.
ANALYZE_ROWS = 1000
# How long the analysis waits for a table another session holds (a manual VACUUM, an index build).
ANALYZE_LOCK_TIMEOUT = "500ms"

log = logging.getLogger("stoa_cp.bulk")


async def publish(db: Database, tenant_id: str, body: BulkIn, max_routes: int) -> BulkOut:
    wanted = {api.api_id: (i, apis.columns(api.api_id, api)) for i, api in enumerate(body.apis)}
    created: list[str] = []
    updated: list[str] = []
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        stored = {
            row["api_id"]: row
            for row in await conn.fetch(
                f"SELECT api_id, tenant_id, {', '.join(apis.COLUMNS)} FROM apis"  # noqa: S608
                " WHERE api_id = ANY($1::text[]) ORDER BY api_id FOR UPDATE",
                list(wanted),
            )
        }
        for api_id, (i, _) in wanted.items():
            holder = stored[api_id]["tenant_id"] if api_id in stored else tenant_id
            if holder != tenant_id:
                raise Taken(f"apis[{i}].api_id", api_id, holder)
        prefixes = {values["path_prefix"]: api_id for api_id, (_, values) in wanted.items()}
        for row in await conn.fetch(
            "SELECT api_id, tenant_id, path_prefix FROM apis WHERE path_prefix = ANY($1::text[])",
            list(prefixes),
        ):
            owner = prefixes[row["path_prefix"]]
            if row["api_id"] != owner:
                raise Taken(f"apis[{wanted[owner][0]}].path_prefix", row["path_prefix"], row["tenant_id"])
        for api_id, (_, values) in wanted.items():
            row = stored.get(api_id)
            if row is None:
                created.append(api_id)
            elif not all(same(row[c], values[c]) for c in apis.COLUMNS):
                updated.append(api_id)
        if created:
            await apis.check_room(conn, tenant_id, len(created), max_routes, field="apis")
        await conn.executemany(
            apis.INSERT, [(a, tenant_id, *(wanted[a][1][c] for c in apis.COLUMNS)) for a in created]
        )
        backing_tools = [
            a
            for a in updated
            if await tools.check_api_change(
                conn, a, wanted[a][1]["kind"], wanted[a][1]["methods"], f"apis[{wanted[a][0]}]."
            )
        ]
        await conn.executemany(apis.UPDATE, [(a, *(wanted[a][1][c] for c in apis.COLUMNS)) for a in updated])
        changed = set(
            await conn.fetchval(
                "SELECT coalesce(array_agg(DISTINCT gateway_id), '{}') FROM deployments"
                " WHERE api_id = ANY($1::text[])",
                updated,
            )
        )
        if backing_tools:
            # Their tools carry their upstream to every gateway where the tenant's MCP routes are.
            changed.update(await tenant_gateways(conn, tenant_id))
        await _check_deployments(conn, tenant_id, body)
        deployed: dict[str, list[str]] = {}
        for group in body.deploy:
            added = [
                row["api_id"]
                for row in await conn.fetch(
                    "INSERT INTO deployments (gateway_id, api_id) SELECT $1, unnest($2::text[])"
                    " ON CONFLICT DO NOTHING RETURNING api_id",
                    group.gateway_id,
                    group.api_ids,
                )
            ]
            if added:
                await unbury(conn, group.gateway_id, added)
                changed.add(group.gateway_id)
                deployed.setdefault(group.gateway_id, []).extend(added)
        removed: dict[str, list[str]] = {}
        for g, group in enumerate(body.undeploy):
            gone = {
                row["api_id"]
                for row in await conn.fetch(
                    "DELETE FROM deployments WHERE gateway_id = $1 AND api_id = ANY($2::text[])"
                    " RETURNING api_id",
                    group.gateway_id,
                    group.api_ids,
                )
            }
            missing = [
                (f"undeploy[{g}].api_ids[{i}]", f"api_id {a!r} is not deployed on {group.gateway_id!r}")
                for i, a in enumerate(group.api_ids)
                if a not in gone
            ]
            if missing:
                raise Problem(404, "Not found", missing)
            if gone:
                changed.add(group.gateway_id)
                removed[group.gateway_id] = sorted(gone)
        bumped = await bump(conn, changed)
        for gateway_id, route_ids in removed.items():
            await bury(conn, route_ids, {gateway_id: bumped[gateway_id]})
        named = {group.gateway_id for group in (*body.deploy, *body.undeploy)}
        generations = {
            row["gateway_id"]: int(row["generation"])
            for row in await conn.fetch(
                "SELECT gateway_id, generation FROM gateways WHERE gateway_id = ANY($1::text[])",
                sorted(named | changed),
            )
        }
    if sum(map(len, (created, updated, *deployed.values(), *removed.values()))) >= ANALYZE_ROWS:
        await _analyze(db)
    return BulkOut(
        created=sorted(created),
        updated=sorted(updated),
        deployed={g: sorted(ids) for g, ids in deployed.items()},
        undeployed=removed,
        generations=generations,
        changed=sorted(bumped),
    )


async def _check_deployments(conn: asyncpg.Connection, tenant_id: str, body: BulkIn) -> None:
    """404 naming each unknown gateway and each API that is not the tenant's; gateways locked in id order."""
    groups = [("deploy", i, g) for i, g in enumerate(body.deploy)] + [
        ("undeploy", i, g) for i, g in enumerate(body.undeploy)
    ]
    gateway_ids = sorted({g.gateway_id for _, _, g in groups})
    found = {
        row["gateway_id"]
        for row in await conn.fetch(
            "SELECT gateway_id FROM gateways WHERE gateway_id = ANY($1::text[])"
            " ORDER BY gateway_id FOR UPDATE",
            gateway_ids,
        )
    }
    unknown_apis = await apis.unknown(
        conn, tenant_id, [(f"{k}[{i}].api_ids", g.api_ids) for k, i, g in groups]
    )
    errors: list[tuple[str, str]] = []
    for (kind, i, group), unknown_in_group in zip(groups, unknown_apis, strict=True):
        if group.gateway_id not in found:
            errors.append((f"{kind}[{i}].gateway_id", f"unknown gateway_id {group.gateway_id!r}"))
        errors.extend(unknown_in_group)
    if errors:
        raise Problem(404, "Not found", errors)


async def _analyze(db: Database) -> None:
    """Statistics for what a large import wrote, after its commit and never at its expense. A table
    filled this way has none until autovacuum comes by (a minute or more), and meanwhile the planner
    walks every deployment of the gateway to find a generation's changed routes (ms per change at
    10,000 routes instead of a fraction of one). A table held by another session is left to
    autovacuum: the import is done and answered either way."""
    try:
        async with db.transaction() as conn:
            await conn.execute(f"SET LOCAL lock_timeout = '{ANALYZE_LOCK_TIMEOUT}'")
            await conn.execute("ANALYZE apis, deployments, tombstones, inventory_removals")
    except (DatabaseUnavailable, ClientGone, asyncpg.PostgresError) as exc:
        log.warning("bulk_analyze_skipped", extra={"fields": {"error": type(exc).__name__}})
