"""APIs of a tenant. An edit or a deletion is a new generation of every gateway the API is deployed on."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import asyncpg
from stoa_translate.fields import DEFAULT_KEY_HEADER

from stoa_cp.problems import Problem, Taken, invalid, not_found
from stoa_cp.schemas import ApiAuth, ApiFields, ApiIn, ApiOut
from stoa_cp.store import tools
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, bury, lock_tenant, tenant_gateways
from stoa_cp.store.tenant_objects import Services, same

COLUMNS = (
    "kind",
    "name",
    "upstream_url",
    "path_prefix",
    "methods",
    "timeout_ms",
    "auth_mode",
    "scopes",
    "forward_credential",
    "envelope",
    "key_header",
    "subscription",
)
_PLACES = ", ".join(f"${i}" for i in range(3, len(COLUMNS) + 3))
INSERT = f"INSERT INTO apis (api_id, tenant_id, {', '.join(COLUMNS)}) VALUES ($1, $2, {_PLACES})"  # noqa: S608
_SETS = ", ".join(f"{c} = ${i}" for i, c in enumerate(COLUMNS, start=2))
UPDATE = f"UPDATE apis SET {_SETS}, updated_at = now() WHERE api_id = $1"  # noqa: S608 - constant text
_SELECT = (
    "SELECT a.api_id, a.tenant_id, a.kind, a.name, a.upstream_url, a.path_prefix, a.methods, a.timeout_ms,"
    " a.auth_mode, a.scopes, a.forward_credential, a.envelope, a.key_header, a.subscription,"
    " COALESCE((SELECT array_agg(d.gateway_id ORDER BY d.gateway_id)"
    " FROM deployments d WHERE d.api_id = a.api_id), '{}') AS deployed_on FROM apis a"
)


# What the router reads of this store (`routers.tenant_objects.Operations`): an identical create
# answers the stored API.
key = "api_id"
model = ApiOut
repeatable = True


def columns(api_id: str, body: ApiFields) -> dict[str, Any]:
    """The stored columns of an API body (defaults filled in)."""
    return {
        "kind": body.kind,
        "name": body.name,
        # An MCP route has no upstream (the column keeps '' for it).
        "upstream_url": body.upstream_url or "",
        "path_prefix": body.path_prefix or f"/apis/{api_id}",
        "methods": body.methods,
        "timeout_ms": body.timeout_ms or 0,
        "auth_mode": body.auth.mode,
        "scopes": body.auth.scopes,
        "forward_credential": body.auth.forward_credential,
        "envelope": body.auth.envelope,
        "key_header": (body.auth.key_header or DEFAULT_KEY_HEADER) if body.auth.mode == "api_key" else "",
        "subscription": body.auth.subscription,
    }


def _out(row: asyncpg.Record) -> ApiOut:
    return ApiOut(
        api_id=row["api_id"],
        tenant_id=row["tenant_id"],
        name=row["name"],
        kind=row["kind"],
        upstream_url=row["upstream_url"] or None,
        path_prefix=row["path_prefix"],
        methods=list(row["methods"]),
        timeout_ms=row["timeout_ms"] or None,
        auth=ApiAuth(
            mode=row["auth_mode"],
            scopes=list(row["scopes"]),
            forward_credential=row["forward_credential"],
            envelope=row["envelope"],
            key_header=row["key_header"] or None,
            subscription=row["subscription"],
        ),
        deployed_on=list(row["deployed_on"]),
    )


async def _taken(db: Database, exc: asyncpg.UniqueViolationError, api_id: str, path_prefix: str) -> Taken:
    # Both are unique across tenants; read outside the failed transaction whose API holds the value.
    field, value = (
        ("path_prefix", path_prefix) if exc.constraint_name == "apis_path_prefix_key" else ("api_id", api_id)
    )
    async with db.connection() as conn:
        holder = await conn.fetchval(f"SELECT tenant_id FROM apis WHERE {field} = $1", value)  # noqa: S608
    return Taken(field, value, holder)


async def tenant_of(db: Database, api_id: str) -> str | None:
    async with db.connection() as conn:
        tenant_id = await conn.fetchval("SELECT tenant_id FROM apis WHERE api_id = $1", api_id)
    return None if tenant_id is None else str(tenant_id)


async def _read(conn: asyncpg.Connection, tenant_id: str, api_id: str, lock: bool = False) -> asyncpg.Record:
    if lock:
        await conn.execute(
            "SELECT 1 FROM apis WHERE api_id = $1 AND tenant_id = $2 FOR UPDATE", api_id, tenant_id
        )
    row = await conn.fetchrow(f"{_SELECT} WHERE a.api_id = $1 AND a.tenant_id = $2", api_id, tenant_id)
    if row is None:
        raise not_found("api_id", api_id)
    return row


async def unknown(
    conn: asyncpg.Connection, tenant_id: str, lists: Sequence[tuple[str, Sequence[str]]]
) -> list[list[tuple[str, str]]]:
    """For each `(field, api_ids)`, an error `(f"{field}[i]", message)` per id that is not an API of the
    tenant (another tenant's API is as unknown as none); one query for all the lists."""
    wanted = sorted({a for _, api_ids in lists for a in api_ids})
    owned = {
        row["api_id"]
        for row in await conn.fetch(
            "SELECT api_id FROM apis WHERE tenant_id = $1 AND api_id = ANY($2::text[])", tenant_id, wanted
        )
    }
    return [
        [
            (f"{field}[{i}]", f"unknown api_id {a!r} for tenant {tenant_id!r}")
            for i, a in enumerate(api_ids)
            if a not in owned
        ]
        for field, api_ids in lists
    ]


async def check_room(
    conn: asyncpg.Connection, tenant_id: str, adding: int, max_routes: int, field: str = "api_id"
) -> None:
    """422 naming the limit when `adding` more APIs would take the tenant past `max_routes`.
    The caller holds the tenant row FOR UPDATE, so two creations cannot both take the last place."""
    count = int(await conn.fetchval("SELECT count(*) FROM apis WHERE tenant_id = $1", tenant_id))
    if count + adding > max_routes:
        raise Problem(
            422,
            "Limit exceeded",
            [(field, f"the tenant has {count} APIs; the limit is {max_routes} (max_routes_per_tenant)")],
        )


def _check_kind(body: ApiFields) -> None:
    problem = body.kind_problem()
    if problem is not None:
        raise invalid(*problem)


async def create(db: Database, services: Services, tenant_id: str, body: ApiIn) -> tuple[ApiOut, bool]:
    """The API, and whether this call created it (an identical API of the tenant is answered as it is)."""
    _check_kind(body)
    max_routes = services.settings.max_routes_per_tenant
    values = columns(body.api_id, body)
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        existing = await conn.fetchrow(f"{_SELECT} WHERE a.api_id = $1", body.api_id)
        if existing is not None:
            if existing["tenant_id"] == tenant_id and all(same(existing[c], values[c]) for c in COLUMNS):
                return _out(existing), False
            raise Taken("api_id", body.api_id, existing["tenant_id"])
        await check_room(conn, tenant_id, 1, max_routes)
        try:
            await conn.execute(INSERT, body.api_id, tenant_id, *(values[c] for c in COLUMNS))
        except asyncpg.UniqueViolationError as exc:
            raise await _taken(db, exc, body.api_id, values["path_prefix"]) from None
        return _out(await _read(conn, tenant_id, body.api_id)), True


async def list_for(db: Database, tenant_id: str) -> list[ApiOut]:
    async with db.connection() as conn:
        rows = await conn.fetch(f"{_SELECT} WHERE a.tenant_id = $1 ORDER BY a.api_id", tenant_id)
    return [_out(row) for row in rows]


async def get(db: Database, tenant_id: str, api_id: str) -> ApiOut:
    async with db.connection() as conn:
        return _out(await _read(conn, tenant_id, api_id))


async def update(db: Database, _services: Services, tenant_id: str, api_id: str, body: ApiFields) -> ApiOut:
    """Store the new fields; an unchanged body changes nothing (no new generation)."""
    _check_kind(body)
    values = columns(api_id, body)
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "share")
        current = await _read(conn, tenant_id, api_id, lock=True)
        if all(same(current[c], values[c]) for c in COLUMNS):
            return _out(current)
        backs_tools = await tools.check_api_change(conn, api_id, values["kind"], values["methods"])
        try:
            await conn.execute(UPDATE, api_id, *(values[c] for c in COLUMNS))
        except asyncpg.UniqueViolationError as exc:
            raise await _taken(db, exc, api_id, values["path_prefix"]) from None
        reach = set(current["deployed_on"])
        if backs_tools:
            # Its tools carry its upstream to every gateway where the tenant's MCP routes are.
            reach.update(await tenant_gateways(conn, tenant_id))
        await bump(conn, reach)
        return _out(await _read(conn, tenant_id, api_id))


async def delete(db: Database, _services: Services, tenant_id: str, api_id: str) -> None:
    """Delete the API; every gateway it was deployed on gets a tombstone and a new generation."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "share")
        current = await _read(conn, tenant_id, api_id, lock=True)
        used_by = await conn.fetchval(
            "SELECT string_agg(name, ', ' ORDER BY name) FROM tools WHERE api_id = $1", api_id
        )
        if used_by:
            raise Problem(409, "Conflict", [("api_id", f"API {api_id!r} backs the tools {used_by}")])
        await bury(conn, [api_id], await bump(conn, current["deployed_on"]))
        await conn.execute("DELETE FROM apis WHERE api_id = $1", api_id)
