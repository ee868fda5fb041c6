"""MCP tools of a tenant, their grants and revocations.

Tools travel in the inventory: a change is a new generation of every gateway where the tenant has a
route. Grants and revocations travel only in the signed tool permissions: a change re-signs them for
those gateways in the same transaction (`tool_permissions.resign`), without a new generation, so a
revocation is in force at the site as soon as the new artifact arrives.
"""

from __future__ import annotations

from typing import Any

import asyncpg
from stoa_translate import tools as tool_rules

from stoa_cp.problems import Problem, Taken, conflict, invalid, not_found
from stoa_cp.schemas import (
    ToolBudget,
    ToolFields,
    ToolGrantIn,
    ToolGrantOut,
    ToolOut,
    ToolRevocationIn,
    ToolRevocationOut,
)
from stoa_cp.store import tool_permissions
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, lock_tenant, tenant_gateways

_RETURNED = (
    "tenant_id, name, description, input_schema, output_schema, annotations, api_id, method,"
    " path_template, budget_calls, budget_window_s"
)
_TOOL = f"SELECT {_RETURNED} FROM tools"  # noqa: S608 - constant text


def _tool(row: asyncpg.Record) -> ToolOut:
    fields = dict(row)
    calls, window = fields.pop("budget_calls"), fields.pop("budget_window_s")
    budget = None if calls is None else ToolBudget(calls=calls, window_seconds=window)
    return ToolOut(**fields, budget=budget)


async def _check(conn: asyncpg.Connection, tenant_id: str, body: ToolFields) -> str:
    """The tool's rules, and its API: one of the tenant's HTTP APIs. Returns the normal method."""
    try:
        body.check()
    except tool_rules.ToolError as exc:
        raise invalid(exc.field, exc.message) from None
    api = await conn.fetchrow(
        "SELECT kind, methods FROM apis WHERE api_id = $1 AND tenant_id = $2 FOR SHARE",
        body.api_id,
        tenant_id,
    )
    if api is None:
        raise not_found("api_id", body.api_id)
    if api["kind"] != "http":
        raise invalid("api_id", f"API {body.api_id!r} is an MCP route, not an operation's API")
    try:
        return tool_rules.method(body.method, list(api["methods"]))
    except tool_rules.ToolError as exc:
        raise invalid(exc.field, exc.message) from None


def _values(body: ToolFields, method: str) -> tuple[Any, ...]:
    return (
        body.description,
        body.input_schema,
        body.output_schema,
        body.annotations,
        body.api_id,
        method,
        body.path_template,
        body.budget.calls if body.budget else None,
        body.budget.window_seconds if body.budget else None,
    )


async def create(db: Database, tenant_id: str, name: str, body: ToolFields) -> ToolOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        method = await _check(conn, tenant_id, body)
        try:
            row = await conn.fetchrow(
                "INSERT INTO tools (tenant_id, name, description, input_schema, output_schema, annotations,"  # noqa: S608
                " api_id, method, path_template, budget_calls, budget_window_s)"
                f" VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) RETURNING {_RETURNED}",
                tenant_id,
                name,
                *_values(body, method),
            )
        except asyncpg.UniqueViolationError:
            raise conflict("name", name) from None
        await bump(conn, await tenant_gateways(conn, tenant_id))
    assert row is not None
    return _tool(row)


async def list_for(db: Database, tenant_id: str) -> list[ToolOut]:
    async with db.connection() as conn:
        rows = await conn.fetch(_TOOL + " WHERE tenant_id = $1 ORDER BY name", tenant_id)
    return [_tool(row) for row in rows]


async def get(db: Database, tenant_id: str, name: str) -> ToolOut:
    async with db.connection() as conn:
        row = await conn.fetchrow(_TOOL + " WHERE tenant_id = $1 AND name = $2", tenant_id, name)
    if row is None:
        raise not_found("name", name)
    return _tool(row)


async def update(db: Database, tenant_id: str, name: str, body: ToolFields) -> ToolOut:
    """Replace the tool's fields; an unchanged body changes nothing (no new generation)."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        current = await conn.fetchrow(
            _TOOL + " WHERE tenant_id = $1 AND name = $2 FOR UPDATE", tenant_id, name
        )
        if current is None:
            raise not_found("name", name)
        method = await _check(conn, tenant_id, body)
        values = _values(body, method)
        keys = ("description", "input_schema", "output_schema", "annotations", "api_id", "method")
        keys += ("path_template", "budget_calls", "budget_window_s")
        if all(current[k] == v for k, v in zip(keys, values, strict=True)):
            return _tool(current)
        row = await conn.fetchrow(
            "UPDATE tools SET description = $3, input_schema = $4, output_schema = $5, annotations = $6,"  # noqa: S608
            " api_id = $7, method = $8, path_template = $9, budget_calls = $10, budget_window_s = $11,"
            f" updated_at = now() WHERE tenant_id = $1 AND name = $2 RETURNING {_RETURNED}",
            tenant_id,
            name,
            *values,
        )
        await bump(conn, await tenant_gateways(conn, tenant_id))
    assert row is not None
    return _tool(row)


async def delete(db: Database, tenant_id: str, name: str, signer: tool_permissions.Signer | None) -> None:
    """Delete the tool and its grants (its revocations stay: a tool of that name made again later is
    still revoked for whom it was)."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        deleted = await conn.fetchval(
            "DELETE FROM tools WHERE tenant_id = $1 AND name = $2 RETURNING 1", tenant_id, name
        )
        if deleted is None:
            raise not_found("name", name)
        reach = await tenant_gateways(conn, tenant_id)
        await bump(conn, reach)
        await tool_permissions.resign(conn, reach, signer)


async def check_api_change(
    conn: asyncpg.Connection, api_id: str, kind: str, methods: list[str], field_prefix: str = ""
) -> bool:
    """Whether tools use the API, after refusing a change that would leave one of them unfit (409
    naming the tools): the API no longer an HTTP API, or a tool's method no longer one it allows. As
    for deleting the API, nothing is dropped or broken silently; change or delete the tools first.
    (The path template is below the API's upstream URL: a new URL or path prefix keeps every tool.)"""
    rows = await conn.fetch("SELECT name, method FROM tools WHERE api_id = $1 ORDER BY name", api_id)
    if rows and kind != "http":
        names = ", ".join(row["name"] for row in rows)
        raise Problem(409, "Conflict", [(f"{field_prefix}kind", f"API {api_id!r} backs the tools {names}")])
    unfit = []
    for row in rows:
        try:
            tool_rules.method(row["method"], methods)
        except tool_rules.ToolError:
            unfit.append(f"{row['name']} ({row['method']})")
    if unfit:
        raise Problem(
            409,
            "Conflict",
            [(f"{field_prefix}methods", f"the tools {', '.join(unfit)} call a method left out")],
        )
    return bool(rows)


# -- grants ----------------------------------------------------------------------------------------


async def _tool_exists(conn: asyncpg.Connection, tenant_id: str, tool: str) -> None:
    if await conn.fetchval("SELECT 1 FROM tools WHERE tenant_id = $1 AND name = $2", tenant_id, tool) is None:
        raise not_found("tool", tool)


async def create_grant(
    db: Database, tenant_id: str, body: ToolGrantIn, signer: tool_permissions.Signer | None
) -> ToolGrantOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        await _tool_exists(conn, tenant_id, body.tool)
        try:
            await conn.execute(
                "INSERT INTO tool_grants (grant_id, tenant_id, tool, consumers, scopes)"
                " VALUES ($1, $2, $3, $4, $5)",
                body.grant_id,
                tenant_id,
                body.tool,
                sorted(set(body.consumers)),
                sorted(set(body.scopes)),
            )
        except asyncpg.UniqueViolationError:
            raise await _taken(conn, "tool_grants", "grant_id", body.grant_id) from None
        await tool_permissions.resign(conn, await tenant_gateways(conn, tenant_id), signer)
    return ToolGrantOut(
        grant_id=body.grant_id,
        tenant_id=tenant_id,
        tool=body.tool,
        consumers=sorted(set(body.consumers)),
        scopes=sorted(set(body.scopes)),
    )


async def _taken(conn: asyncpg.Connection, table: str, field: str, value: str) -> Problem:
    # Ids unique across tenants: another tenant's answers like every other object of another tenant.
    holder = await conn.fetchval(f"SELECT tenant_id FROM {table} WHERE {field} = $1", value)  # noqa: S608
    return Taken(field, value, holder) if holder is not None else conflict(field, value)


async def list_grants(db: Database, tenant_id: str) -> list[ToolGrantOut]:
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT grant_id, tenant_id, tool, consumers, scopes FROM tool_grants WHERE tenant_id = $1"
            " ORDER BY grant_id",
            tenant_id,
        )
    return [ToolGrantOut(**dict(row)) for row in rows]


async def delete_grant(
    db: Database, tenant_id: str, grant_id: str, signer: tool_permissions.Signer | None
) -> None:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        deleted = await conn.fetchval(
            "DELETE FROM tool_grants WHERE grant_id = $1 AND tenant_id = $2 RETURNING 1", grant_id, tenant_id
        )
        if deleted is None:
            raise not_found("grant_id", grant_id)
        await tool_permissions.resign(conn, await tenant_gateways(conn, tenant_id), signer)


# -- revocations -----------------------------------------------------------------------------------


async def create_revocation(
    db: Database, tenant_id: str, body: ToolRevocationIn, signer: tool_permissions.Signer | None
) -> ToolRevocationOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        await _tool_exists(conn, tenant_id, body.tool)
        try:
            await conn.execute(
                "INSERT INTO tool_revocations (revocation_id, tenant_id, tool, consumer)"
                " VALUES ($1, $2, $3, $4)",
                body.revocation_id,
                tenant_id,
                body.tool,
                body.consumer,
            )
        except asyncpg.UniqueViolationError:
            raise await _taken(conn, "tool_revocations", "revocation_id", body.revocation_id) from None
        await tool_permissions.resign(conn, await tenant_gateways(conn, tenant_id), signer)
    return ToolRevocationOut(
        revocation_id=body.revocation_id, tenant_id=tenant_id, tool=body.tool, consumer=body.consumer
    )


async def list_revocations(db: Database, tenant_id: str) -> list[ToolRevocationOut]:
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT revocation_id, tenant_id, tool, consumer FROM tool_revocations WHERE tenant_id = $1"
            " ORDER BY revocation_id",
            tenant_id,
        )
    return [ToolRevocationOut(**dict(row)) for row in rows]


async def delete_revocation(
    db: Database, tenant_id: str, revocation_id: str, signer: tool_permissions.Signer | None
) -> None:
    """Lift the revocation."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        deleted = await conn.fetchval(
            "DELETE FROM tool_revocations WHERE revocation_id = $1 AND tenant_id = $2 RETURNING 1",
            revocation_id,
            tenant_id,
        )
        if deleted is None:
            raise not_found("revocation_id", revocation_id)
        await tool_permissions.resign(conn, await tenant_gateways(conn, tenant_id), signer)
