"""Policies: tenant/api-scoped under a tenant, gateway-scoped under a gateway.

Reach (which inventories list a policy, hence which gateways a change bumps): a gateway-scoped policy is
listed on its gateway; a tenant- or api-scoped policy on every gateway where its tenant has a route.
"""

from __future__ import annotations

import asyncpg

from stoa_cp.problems import Problem, conflict, not_found
from stoa_cp.schemas import (
    GatewayPolicyFields,
    GatewayPolicyIn,
    PolicyOut,
    TenantPolicyFields,
    TenantPolicyIn,
)
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, lock_gateway, lock_tenant, tenant_gateways

_FIELDS = "policy_id, type, config, scope, targets, tenant_id, gateway_id"
_SELECT = f"SELECT {_FIELDS} FROM policies"  # noqa: S608 - constant text, no input


def _out(row: asyncpg.Record) -> PolicyOut:
    return PolicyOut(**{**dict(row), "targets": list(row["targets"])})


def _targets(body: TenantPolicyFields) -> list[str]:
    return sorted(set(body.targets))


async def _check_targets(conn: asyncpg.Connection, tenant_id: str, body: TenantPolicyFields) -> None:
    """422 naming each target of an api-scoped policy that is not an API of the tenant."""
    if body.scope != "api":
        return
    owned = {
        row["api_id"]
        for row in await conn.fetch(
            "SELECT api_id FROM apis WHERE tenant_id = $1 AND api_id = ANY($2::text[])",
            tenant_id,
            body.targets,
        )
    }
    errors = [
        (f"targets[{i}]", f"unknown api_id {t!r} for tenant {tenant_id!r}")
        for i, t in enumerate(body.targets)
        if t not in owned
    ]
    if errors:
        raise Problem(422, "Validation failed", errors)


async def _tenant_policy(
    conn: asyncpg.Connection, tenant_id: str, policy_id: str, lock: bool
) -> asyncpg.Record:
    suffix = " FOR UPDATE" if lock else ""
    row = await conn.fetchrow(
        f"{_SELECT} WHERE policy_id = $1 AND tenant_id = $2{suffix}", policy_id, tenant_id
    )
    if row is None:
        raise not_found("policy_id", policy_id)
    return row


async def create_for_tenant(db: Database, tenant_id: str, body: TenantPolicyIn) -> PolicyOut:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        await _check_targets(conn, tenant_id, body)
        try:
            row = await conn.fetchrow(
                "INSERT INTO policies (policy_id, type, config, scope, targets, tenant_id)"  # noqa: S608
                f" VALUES ($1, $2, $3, $4, $5, $6) RETURNING {_FIELDS}",
                body.policy_id,
                body.type,
                body.config,
                body.scope,
                _targets(body),
                tenant_id,
            )
        except asyncpg.UniqueViolationError:
            raise conflict("policy_id", body.policy_id) from None
        await bump(conn, await tenant_gateways(conn, tenant_id))
    assert row is not None
    return _out(row)


async def list_for_tenant(db: Database, tenant_id: str) -> list[PolicyOut]:
    async with db.connection() as conn:
        rows = await conn.fetch(f"{_SELECT} WHERE tenant_id = $1 ORDER BY policy_id", tenant_id)
    return [_out(r) for r in rows]


async def get_for_tenant(db: Database, tenant_id: str, policy_id: str) -> PolicyOut:
    async with db.connection() as conn:
        return _out(await _tenant_policy(conn, tenant_id, policy_id, lock=False))


async def update_for_tenant(
    db: Database, tenant_id: str, policy_id: str, body: TenantPolicyFields
) -> PolicyOut:
    """Store the new policy; an unchanged body changes nothing (no new generation)."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        current = await _tenant_policy(conn, tenant_id, policy_id, lock=True)
        await _check_targets(conn, tenant_id, body)
        wanted = (body.type, body.config, body.scope, _targets(body))
        if (current["type"], current["config"], current["scope"], list(current["targets"])) == wanted:
            return _out(current)
        await conn.execute(
            "UPDATE policies SET type = $2, config = $3, scope = $4, targets = $5, updated_at = now()"
            " WHERE policy_id = $1",
            policy_id,
            *wanted,
        )
        await bump(conn, await tenant_gateways(conn, tenant_id))
        return _out(await _tenant_policy(conn, tenant_id, policy_id, lock=False))


async def delete_for_tenant(db: Database, tenant_id: str, policy_id: str) -> None:
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        await _tenant_policy(conn, tenant_id, policy_id, lock=True)
        await conn.execute("DELETE FROM policies WHERE policy_id = $1", policy_id)
        await bump(conn, await tenant_gateways(conn, tenant_id))


async def _gateway_policy(conn: asyncpg.Connection, gateway_id: str, policy_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(f"{_SELECT} WHERE policy_id = $1 AND gateway_id = $2", policy_id, gateway_id)
    if row is None:
        raise not_found("policy_id", policy_id)
    return row


async def create_for_gateway(db: Database, gateway_id: str, body: GatewayPolicyIn) -> PolicyOut:
    async with db.transaction() as conn:
        await lock_gateway(conn, gateway_id)
        try:
            await conn.execute(
                "INSERT INTO policies (policy_id, type, config, scope, gateway_id)"
                " VALUES ($1, $2, $3, 'gateway', $4)",
                body.policy_id,
                body.type,
                body.config,
                gateway_id,
            )
        except asyncpg.UniqueViolationError:
            raise conflict("policy_id", body.policy_id) from None
        await bump(conn, [gateway_id])
        return _out(await _gateway_policy(conn, gateway_id, body.policy_id))


async def list_for_gateway(db: Database, gateway_id: str) -> list[PolicyOut]:
    async with db.connection() as conn:
        rows = await conn.fetch(f"{_SELECT} WHERE gateway_id = $1 ORDER BY policy_id", gateway_id)
    return [_out(r) for r in rows]


async def get_for_gateway(db: Database, gateway_id: str, policy_id: str) -> PolicyOut:
    async with db.connection() as conn:
        return _out(await _gateway_policy(conn, gateway_id, policy_id))


async def update_for_gateway(
    db: Database, gateway_id: str, policy_id: str, body: GatewayPolicyFields
) -> PolicyOut:
    """Store the new policy; an unchanged body changes nothing (no new generation)."""
    async with db.transaction() as conn:
        await lock_gateway(conn, gateway_id)
        current = await _gateway_policy(conn, gateway_id, policy_id)
        if (current["type"], current["config"]) == (body.type, body.config):
            return _out(current)
        await conn.execute(
            "UPDATE policies SET type = $2, config = $3, updated_at = now() WHERE policy_id = $1",
            policy_id,
            body.type,
            body.config,
        )
        await bump(conn, [gateway_id])
        return _out(await _gateway_policy(conn, gateway_id, policy_id))


async def delete_for_gateway(db: Database, gateway_id: str, policy_id: str) -> None:
    async with db.transaction() as conn:
        await lock_gateway(conn, gateway_id)
        await _gateway_policy(conn, gateway_id, policy_id)
        await conn.execute("DELETE FROM policies WHERE policy_id = $1", policy_id)
        await bump(conn, [gateway_id])
