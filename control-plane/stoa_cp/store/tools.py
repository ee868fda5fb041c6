"""MCP tools of a tenant, their grants and revocations.

Tools travel in the inventory: a change is a new generation of every gateway where the tenant has a
route. Grants and revocations travel only in the signed tool permissions: a change re-signs them for
those gateways in the same transaction (`tool_permissions.resign`), without a new generation, so a
revocation is in force at the site as soon as the new artifact arrives.
"""

from __future__ import annotations

import asyncpg
from stoa_translate import tools as tool_rules

from stoa_cp.problems import Problem, invalid, not_found
from stoa_cp.schemas import (
    ToolBudget,
    ToolFields,
    ToolGrantIn,
    ToolGrantOut,
    ToolOut,
    ToolRevocationIn,
    ToolRevocationOut,
)
from stoa_cp.store.tenant_objects import PERMISSIONS, Kind, Objects, Reach, Values

_TOOL_FIELDS = (
    "description",
    "input_schema",
    "output_schema",
    "annotations",
    "api_id",
    "method",
    "path_template",
)


def _tool(row: asyncpg.Record) -> ToolOut:
    fields = dict(row)
    calls, window = fields.pop("budget_calls"), fields.pop("budget_window_s")
    budget = None if calls is None else ToolBudget(calls=calls, window_seconds=window)
    return ToolOut(**fields, budget=budget)


async def _check(conn: asyncpg.Connection, tenant_id: str, body: ToolFields) -> Values:
    """The tool's rules, and its API: one of the tenant's HTTP APIs. The method in its normal form."""
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
        return {"method": tool_rules.method(body.method, list(api["methods"]))}
    except tool_rules.ToolError as exc:
        raise invalid(exc.field, exc.message) from None


def _values(body: ToolFields) -> Values:
    return {
        **body.model_dump(include=set(_TOOL_FIELDS)),
        "budget_calls": body.budget.calls if body.budget else None,
        "budget_window_s": body.budget.window_seconds if body.budget else None,
    }


TOOLS = Kind(
    table="tools",
    key="name",
    columns=(*_TOOL_FIELDS, "budget_calls", "budget_window_s"),
    model=ToolOut,
    out=_tool,
    values=_values,
    check=_check,
    set_on_replace="updated_at = now()",
    # Deleting a tool deletes its grants: its permissions change too. (Its revocations stay: a tool of
    # that name made again later is still revoked for whom it was.)
    deleted_reach=Reach(generation=True, permissions=True),
)
objects = Objects(TOOLS)


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


# -- grants and revocations --------------------------------------------------------------------------


async def _tool_exists(
    conn: asyncpg.Connection, tenant_id: str, body: ToolGrantIn | ToolRevocationIn
) -> Values:
    found = await conn.fetchval(
        "SELECT 1 FROM tools WHERE tenant_id = $1 AND name = $2", tenant_id, body.tool
    )
    if found is None:
        raise not_found("tool", body.tool)
    return {}


def _grant(body: ToolGrantIn) -> Values:
    return {"tool": body.tool, "consumers": sorted(set(body.consumers)), "scopes": sorted(set(body.scopes))}


# Ids unique across tenants: another tenant's answers like every other object of another tenant.
grants = Objects(
    Kind(
        table="tool_grants",
        key="grant_id",
        columns=("tool", "consumers", "scopes"),
        model=ToolGrantOut,
        values=_grant,
        check=_tool_exists,
        reach=PERMISSIONS,
        unique_across_tenants=True,
    )
)
revocations = Objects(
    Kind(
        table="tool_revocations",
        key="revocation_id",
        columns=("tool", "consumer"),
        model=ToolRevocationOut,
        check=_tool_exists,
        reach=PERMISSIONS,
        unique_across_tenants=True,
    )
)
