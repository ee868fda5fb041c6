from __future__ import annotations

from typing import Any

import asyncpg
from fastapi import APIRouter, Response

from stoa_cp.auth import Admin, Db
from stoa_cp.problems import PROBLEM_RESPONSES, conflict, invalid, not_found
from stoa_cp.publish import bump, lock_tenant, require_tenant
from stoa_cp.schemas import ApiAuth, ApiFields, ApiIn, ApiOut, ApiUpdate

router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/apis", tags=["apis"], dependencies=[Admin], responses=PROBLEM_RESPONSES
)

_COLUMNS = ("name", "upstream_url", "path_prefix", "methods", "timeout_ms", "auth_mode", "scopes")
_SELECT = (
    "SELECT a.api_id, a.tenant_id, a.name, a.upstream_url, a.path_prefix, a.methods, a.timeout_ms,"
    " a.auth_mode, a.scopes, COALESCE((SELECT array_agg(d.gateway_id ORDER BY d.gateway_id)"
    " FROM deployments d WHERE d.api_id = a.api_id), '{}') AS deployed_on FROM apis a"
)


def _columns(api_id: str, body: ApiFields) -> dict[str, Any]:
    return {
        "name": body.name,
        "upstream_url": body.upstream_url,
        "path_prefix": body.path_prefix or f"/apis/{api_id}",
        "methods": body.methods,
        "timeout_ms": body.timeout_ms or 0,
        "auth_mode": body.auth.mode,
        "scopes": body.auth.scopes,
    }


def _out(row: asyncpg.Record) -> ApiOut:
    return ApiOut(
        api_id=row["api_id"],
        tenant_id=row["tenant_id"],
        name=row["name"],
        upstream_url=row["upstream_url"],
        path_prefix=row["path_prefix"],
        methods=list(row["methods"]),
        timeout_ms=row["timeout_ms"] or None,
        auth=ApiAuth(mode=row["auth_mode"], scopes=list(row["scopes"])),
        deployed_on=list(row["deployed_on"]),
    )


def _unique_problem(exc: asyncpg.UniqueViolationError, api_id: str, path_prefix: str) -> Exception:
    if exc.constraint_name == "apis_path_prefix_key":
        return conflict("path_prefix", path_prefix)
    return conflict("api_id", api_id)


async def _read(conn: asyncpg.Connection, tenant_id: str, api_id: str, lock: bool = False) -> asyncpg.Record:
    if lock:
        await conn.execute(
            "SELECT 1 FROM apis WHERE api_id = $1 AND tenant_id = $2 FOR UPDATE", api_id, tenant_id
        )
    row = await conn.fetchrow(f"{_SELECT} WHERE a.api_id = $1 AND a.tenant_id = $2", api_id, tenant_id)
    if row is None:
        raise not_found("api_id", api_id)
    return row


@router.post("", status_code=201)
async def create_api(tenant_id: str, body: ApiIn, db: Db) -> ApiOut:
    values = _columns(body.api_id, body)
    async with db.acquire() as conn, conn.transaction():
        await lock_tenant(conn, tenant_id, "share")
        try:
            await conn.execute(
                "INSERT INTO apis (api_id, tenant_id, name, upstream_url, path_prefix, methods, timeout_ms,"
                " auth_mode, scopes) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                body.api_id,
                tenant_id,
                *(values[c] for c in _COLUMNS),
            )
        except asyncpg.UniqueViolationError as exc:
            raise _unique_problem(exc, body.api_id, values["path_prefix"]) from None
        return _out(await _read(conn, tenant_id, body.api_id))


@router.get("")
async def list_apis(tenant_id: str, db: Db) -> list[ApiOut]:
    async with db.acquire() as conn:
        await require_tenant(conn, tenant_id)
        rows = await conn.fetch(f"{_SELECT} WHERE a.tenant_id = $1 ORDER BY a.api_id", tenant_id)
    return [_out(row) for row in rows]


@router.get("/{api_id}")
async def get_api(tenant_id: str, api_id: str, db: Db) -> ApiOut:
    async with db.acquire() as conn:
        await require_tenant(conn, tenant_id)
        return _out(await _read(conn, tenant_id, api_id))


@router.put("/{api_id}")
async def update_api(tenant_id: str, api_id: str, body: ApiUpdate, db: Db) -> ApiOut:
    if body.api_id is not None and body.api_id != api_id:
        raise invalid("api_id", "must equal the api_id of the path (an API cannot be renamed)")
    values = _columns(api_id, body)
    async with db.acquire() as conn, conn.transaction():
        await lock_tenant(conn, tenant_id, "share")
        current = await _read(conn, tenant_id, api_id, lock=True)
        if all(_same(current[c], values[c]) for c in _COLUMNS):
            return _out(current)
        try:
            await conn.execute(
                "UPDATE apis SET name = $2, upstream_url = $3, path_prefix = $4, methods = $5,"
                " timeout_ms = $6, auth_mode = $7, scopes = $8, updated_at = now() WHERE api_id = $1",
                api_id,
                *(values[c] for c in _COLUMNS),
            )
        except asyncpg.UniqueViolationError as exc:
            raise _unique_problem(exc, api_id, values["path_prefix"]) from None
        await bump(conn, current["deployed_on"])
        return _out(await _read(conn, tenant_id, api_id))


@router.delete("/{api_id}", status_code=204)
async def delete_api(tenant_id: str, api_id: str, db: Db) -> Response:
    """Delete the API; every gateway it was deployed on gets a tombstone and a new generation."""
    async with db.acquire() as conn, conn.transaction():
        await lock_tenant(conn, tenant_id, "share")
        current = await _read(conn, tenant_id, api_id, lock=True)
        bumped = await bump(conn, current["deployed_on"])
        await conn.execute(
            "INSERT INTO tombstones (gateway_id, route_id, generation)"
            " SELECT g, $1, gen FROM unnest($2::text[], $3::bigint[]) AS t(g, gen)"
            " ON CONFLICT (gateway_id, route_id) DO UPDATE SET generation = EXCLUDED.generation",
            api_id,
            list(bumped),
            list(bumped.values()),
        )
        await conn.execute("DELETE FROM apis WHERE api_id = $1", api_id)
    return Response(status_code=204)


def _same(stored: object, wanted: object) -> bool:
    if isinstance(stored, list | tuple) or isinstance(wanted, list | tuple):
        return list(stored or []) == list(wanted or [])  # type: ignore[call-overload]
    return stored == wanted
