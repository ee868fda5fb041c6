"""Policies: tenant/api-scoped under a tenant, gateway-scoped under a gateway.

Reach (which inventories list a policy, hence which gateways a change bumps): a gateway-scoped policy is
listed on its gateway; a tenant- or api-scoped policy on every gateway where its tenant has a route,
with `applicable` computed per gateway (possibly empty, e.g. an api policy without targets).
"""

from __future__ import annotations

import asyncpg
from fastapi import APIRouter, Response

from stoa_cp import policy_config
from stoa_cp.auth import Admin, Db
from stoa_cp.problems import PROBLEM_RESPONSES, Problem, conflict, invalid, not_found
from stoa_cp.publish import (
    bump,
    lock_gateway,
    lock_tenant,
    require_gateway,
    require_tenant,
    tenant_gateways,
)
from stoa_cp.schemas import (
    GatewayPolicyIn,
    GatewayPolicyUpdate,
    PolicyOut,
    TenantPolicyFields,
    TenantPolicyIn,
    TenantPolicyUpdate,
)

tenant_router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/policies",
    tags=["policies"],
    dependencies=[Admin],
    responses=PROBLEM_RESPONSES,
)
gateway_router = APIRouter(
    prefix="/v1/gateways/{gateway_id}/policies",
    tags=["policies"],
    dependencies=[Admin],
    responses=PROBLEM_RESPONSES,
)

_FIELDS = "policy_id, type, config, scope, targets, tenant_id, gateway_id"
_SELECT = f"SELECT {_FIELDS} FROM policies"  # noqa: S608 - constant text, no input


def _out(row: asyncpg.Record) -> PolicyOut:
    return PolicyOut(**{**dict(row), "targets": list(row["targets"])})


async def _check_tenant_policy(conn: asyncpg.Connection, tenant_id: str, body: TenantPolicyFields) -> None:
    policy_config.check(body.type, body.config)
    if body.scope == "tenant" and body.targets:
        raise invalid("targets", "must be empty for scope 'tenant' (it applies to every route of the tenant)")
    if body.scope == "api":
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


def _targets(body: TenantPolicyFields) -> list[str]:
    return sorted(set(body.targets))


@tenant_router.post("", status_code=201)
async def create_tenant_policy(tenant_id: str, body: TenantPolicyIn, db: Db) -> PolicyOut:
    async with db.acquire() as conn, conn.transaction():
        await lock_tenant(conn, tenant_id, "update")
        await _check_tenant_policy(conn, tenant_id, body)
        try:
            row = await conn.fetchrow(
                "INSERT INTO policies (policy_id, type, config, scope, targets, tenant_id)"
                " VALUES ($1, $2, $3, $4, $5, $6)"
                " RETURNING policy_id, type, config, scope, targets, tenant_id, gateway_id",
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
    return _out(row)


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


@tenant_router.get("")
async def list_tenant_policies(tenant_id: str, db: Db) -> list[PolicyOut]:
    async with db.acquire() as conn:
        await require_tenant(conn, tenant_id)
        return [
            _out(r) for r in await conn.fetch(f"{_SELECT} WHERE tenant_id = $1 ORDER BY policy_id", tenant_id)
        ]


@tenant_router.get("/{policy_id}")
async def get_tenant_policy(tenant_id: str, policy_id: str, db: Db) -> PolicyOut:
    async with db.acquire() as conn:
        await require_tenant(conn, tenant_id)
        return _out(await _tenant_policy(conn, tenant_id, policy_id, lock=False))


@tenant_router.put("/{policy_id}")
async def update_tenant_policy(tenant_id: str, policy_id: str, body: TenantPolicyUpdate, db: Db) -> PolicyOut:
    if body.policy_id is not None and body.policy_id != policy_id:
        raise invalid("policy_id", "must equal the policy_id of the path")
    async with db.acquire() as conn, conn.transaction():
        await lock_tenant(conn, tenant_id, "update")
        current = await _tenant_policy(conn, tenant_id, policy_id, lock=True)
        await _check_tenant_policy(conn, tenant_id, body)
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


@tenant_router.delete("/{policy_id}", status_code=204)
async def delete_tenant_policy(tenant_id: str, policy_id: str, db: Db) -> Response:
    async with db.acquire() as conn, conn.transaction():
        await lock_tenant(conn, tenant_id, "update")
        await _tenant_policy(conn, tenant_id, policy_id, lock=True)
        await conn.execute("DELETE FROM policies WHERE policy_id = $1", policy_id)
        await bump(conn, await tenant_gateways(conn, tenant_id))
    return Response(status_code=204)


# -- gateway scope ------------------------------------------------------------------------------
async def _gateway_policy(conn: asyncpg.Connection, gateway_id: str, policy_id: str) -> asyncpg.Record:
    row = await conn.fetchrow(f"{_SELECT} WHERE policy_id = $1 AND gateway_id = $2", policy_id, gateway_id)
    if row is None:
        raise not_found("policy_id", policy_id)
    return row


@gateway_router.post("", status_code=201)
async def create_gateway_policy(gateway_id: str, body: GatewayPolicyIn, db: Db) -> PolicyOut:
    policy_config.check(body.type, body.config)
    async with db.acquire() as conn, conn.transaction():
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


@gateway_router.get("")
async def list_gateway_policies(gateway_id: str, db: Db) -> list[PolicyOut]:
    async with db.acquire() as conn:
        await require_gateway(conn, gateway_id)
        return [
            _out(r)
            for r in await conn.fetch(f"{_SELECT} WHERE gateway_id = $1 ORDER BY policy_id", gateway_id)
        ]


@gateway_router.get("/{policy_id}")
async def get_gateway_policy(gateway_id: str, policy_id: str, db: Db) -> PolicyOut:
    async with db.acquire() as conn:
        await require_gateway(conn, gateway_id)
        return _out(await _gateway_policy(conn, gateway_id, policy_id))


@gateway_router.put("/{policy_id}")
async def update_gateway_policy(
    gateway_id: str, policy_id: str, body: GatewayPolicyUpdate, db: Db
) -> PolicyOut:
    if body.policy_id is not None and body.policy_id != policy_id:
        raise invalid("policy_id", "must equal the policy_id of the path")
    policy_config.check(body.type, body.config)
    async with db.acquire() as conn, conn.transaction():
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


@gateway_router.delete("/{policy_id}", status_code=204)
async def delete_gateway_policy(gateway_id: str, policy_id: str, db: Db) -> Response:
    async with db.acquire() as conn, conn.transaction():
        await lock_gateway(conn, gateway_id)
        await _gateway_policy(conn, gateway_id, policy_id)
        await conn.execute("DELETE FROM policies WHERE policy_id = $1", policy_id)
        await bump(conn, [gateway_id])
    return Response(status_code=204)
