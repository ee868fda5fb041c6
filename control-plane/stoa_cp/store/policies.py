"""Policies: tenant/api-scoped under a tenant, gateway-scoped under a gateway.

Reach (which inventories list a policy, hence which gateways a change bumps): a gateway-scoped policy is
listed on its gateway; a tenant- or api-scoped policy on every gateway where its tenant has a route.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import asyncpg
from stoa_translate.policies import ConfigError, UnsupportedKind, accept_json

from stoa_cp.problems import Problem, Taken, not_found
from stoa_cp.schemas import (
    GatewayPolicyFields,
    GatewayPolicyIn,
    PolicyOut,
    TenantPolicyFields,
    TenantPolicyIn,
)
from stoa_cp.store.database import Database
from stoa_cp.store.inventory import applicable
from stoa_cp.store.publication import bump, lock_gateway, lock_tenant, tenant_gateways

log = logging.getLogger("stoa_cp")

_FIELDS = "policy_id, type, config, scope, targets, tenant_id, gateway_id, invalid_reason"
_SELECT = f"SELECT {_FIELDS} FROM policies"  # noqa: S608 - constant text, no input


def _out(row: asyncpg.Record) -> PolicyOut:
    return PolicyOut(**{**dict(row), "targets": list(row["targets"])})


def _targets(body: TenantPolicyFields) -> list[str]:
    return sorted(set(body.targets))


async def _check_targets(conn: asyncpg.Connection, tenant_id: str, body: TenantPolicyFields) -> None:
    """404 naming each target of an api-scoped policy that is not an API of the tenant (a rule on the
    stored state, so not the 422 of a malformed body; another tenant's API is as unknown as none)."""
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
        raise Problem(404, "Not found", errors)


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


async def _taken(db: Database, policy_id: str) -> Taken:
    # Read outside the failed transaction: policy_id is unique across tenants and gateways.
    async with db.connection() as conn:
        holder = await conn.fetchval("SELECT tenant_id FROM policies WHERE policy_id = $1", policy_id)
    return Taken("policy_id", policy_id, holder)


async def _replayed(conn: asyncpg.Connection, policy_id: str, wanted: dict[str, object]) -> PolicyOut | None:
    """The stored policy when it is exactly the one asked for; 409 (Taken) when another holds the id."""
    row = await conn.fetchrow(f"{_SELECT} WHERE policy_id = $1", policy_id)
    if row is None:
        return None
    stored = _out(row)
    if any(getattr(stored, field) != value for field, value in wanted.items()):
        raise Taken("policy_id", policy_id, row["tenant_id"])
    return stored


async def create_for_tenant(db: Database, tenant_id: str, body: TenantPolicyIn) -> tuple[PolicyOut, bool]:
    """The policy, and whether this call created it (an identical policy is answered as it is)."""
    async with db.transaction() as conn:
        await lock_tenant(conn, tenant_id, "update")
        await _check_targets(conn, tenant_id, body)
        wanted = {
            "type": body.type,
            "config": body.config,
            "scope": body.scope,
            "targets": _targets(body),
            "tenant_id": tenant_id,
            "gateway_id": None,
        }
        replayed = await _replayed(conn, body.policy_id, wanted)
        if replayed is not None:
            return replayed, False
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
            raise await _taken(db, body.policy_id) from None
        gateways = await tenant_gateways(conn, tenant_id)
        await refuse_overlaps(conn, gateways, policy_id=body.policy_id)
        await bump(conn, gateways)
    assert row is not None
    return _out(row), True


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
        stored = (current["type"], current["config"], current["scope"], list(current["targets"]))
        if stored == wanted and current["invalid_reason"] is None:
            return _out(current)
        await conn.execute(
            "UPDATE policies SET type = $2, config = $3, scope = $4, targets = $5, updated_at = now(),"
            " config_schema = 2, invalid_reason = NULL WHERE policy_id = $1",
            policy_id,
            *wanted,
        )
        gateways = await tenant_gateways(conn, tenant_id)
        await refuse_overlaps(conn, gateways, policy_id=policy_id)
        await bump(conn, gateways)
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


async def create_for_gateway(db: Database, gateway_id: str, body: GatewayPolicyIn) -> tuple[PolicyOut, bool]:
    """The policy, and whether this call created it (an identical policy is answered as it is)."""
    async with db.transaction() as conn:
        await lock_gateway(conn, gateway_id)
        wanted = {
            "type": body.type,
            "config": body.config,
            "scope": "gateway",
            "tenant_id": None,
            "gateway_id": gateway_id,
        }
        replayed = await _replayed(conn, body.policy_id, wanted)
        if replayed is not None:
            return replayed, False
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
            raise await _taken(db, body.policy_id) from None
        await refuse_overlaps(conn, [gateway_id], policy_id=body.policy_id)
        await bump(conn, [gateway_id])
        return _out(await _gateway_policy(conn, gateway_id, body.policy_id)), True


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
        unchanged = (current["type"], current["config"]) == (body.type, body.config)
        if unchanged and current["invalid_reason"] is None:
            return _out(current)
        await conn.execute(
            "UPDATE policies SET type = $2, config = $3, updated_at = now(), config_schema = 2,"
            " invalid_reason = NULL WHERE policy_id = $1",
            policy_id,
            body.type,
            body.config,
        )
        await refuse_overlaps(conn, [gateway_id], policy_id=policy_id)
        await bump(conn, [gateway_id])
        return _out(await _gateway_policy(conn, gateway_id, policy_id))


async def delete_for_gateway(db: Database, gateway_id: str, policy_id: str) -> None:
    async with db.transaction() as conn:
        await lock_gateway(conn, gateway_id)
        await _gateway_policy(conn, gateway_id, policy_id)
        await conn.execute("DELETE FROM policies WHERE policy_id = $1", policy_id)
        await bump(conn, [gateway_id])


async def refuse_overlaps(
    conn: asyncpg.Connection,
    gateway_ids: Iterable[str],
    *,
    policy_id: str | None = None,
    route_id: str | None = None,
) -> None:
    """409 when, on one of `gateway_ids`, two valid policies of one kind apply to one route and the
    pair involves `policy_id` (a policy write) or `route_id` (a deployment). Run inside the write's
    transaction after the change, so nothing is stored when it refuses. The site refuses such an
    inventory (DUPLICATE_POLICY); the write that would create it is refused instead."""
    for gateway_id in sorted(set(gateway_ids)):
        routes = await conn.fetch(
            "SELECT a.api_id, a.tenant_id FROM deployments d JOIN apis a ON a.api_id = d.api_id"
            " WHERE d.gateway_id = $1 ORDER BY a.api_id",
            gateway_id,
        )
        all_routes = [r["api_id"] for r in routes]
        by_tenant: dict[str, list[str]] = {}
        for r in routes:
            by_tenant.setdefault(r["tenant_id"], []).append(r["api_id"])
        rows = await conn.fetch(
            "SELECT policy_id, type, scope, targets, tenant_id FROM policies WHERE invalid_reason IS NULL"
            " AND (gateway_id = $1 OR tenant_id = ANY($2::text[])) ORDER BY policy_id",
            gateway_id,
            sorted(by_tenant),
        )
        owners: dict[tuple[str, str], list[str]] = {}
        for row in rows:
            for route in applicable(row["scope"], row["tenant_id"], row["targets"], all_routes, by_tenant):
                owners.setdefault((route, row["type"]), []).append(row["policy_id"])
        for (route, kind), ids in sorted(owners.items()):
            if len(ids) < 2:
                continue
            rule = f"on gateway {gateway_id}: one policy of a type per route"
            if policy_id in ids:
                other = next(i for i in ids if i != policy_id)
                detail = f"policy {other} of type {kind} already applies to route {route} {rule}"
                raise Problem(409, "Conflict", [("policy_id", detail)])
            if route == route_id:
                detail = (
                    f"policies {ids[0]} and {ids[1]} of type {kind} would both apply to route {route} {rule}"
                )
                raise Problem(409, "Conflict", [("api_id", detail)])


async def adopt_typed_configs(conn: asyncpg.Connection) -> int:
    """Re-read every policy stored before typed configs by the translator's rules: store its normal
    form, or keep it marked invalid with the reason. Gateways it reaches get a new generation (their
    inventory changes). Returns how many rows it re-read; 0 once done."""
    rows = await conn.fetch(
        "SELECT policy_id, type, config, tenant_id, gateway_id FROM policies"
        " WHERE config_schema = 1 FOR UPDATE"
    )
    reached: set[str] = set()
    for row in rows:
        try:
            config, reason = accept_json(row["type"], row["policy_id"], row["config"]), None
        except (UnsupportedKind, ConfigError) as exc:
            config, reason = row["config"], str(exc)
        await conn.execute(
            "UPDATE policies SET config = $2, invalid_reason = $3, config_schema = 2 WHERE policy_id = $1",
            row["policy_id"],
            config,
            reason,
        )
        if reason is not None:
            log.warning("policy %s kept but marked invalid: %s", row["policy_id"], reason)
        if row["gateway_id"] is not None:
            reached.add(row["gateway_id"])
        else:
            reached.update(await tenant_gateways(conn, row["tenant_id"]))
    await bump(conn, reached)
    return len(rows)


async def invalid_reaching(conn: asyncpg.Connection, gateway_id: str) -> list[tuple[str, str, str | None]]:
    """(policy id, reason, tenant id or None for a gateway policy) of the invalid policies that would
    reach the gateway: left out of its inventory, so its status says so."""
    rows = await conn.fetch(
        "SELECT policy_id, invalid_reason, tenant_id FROM policies WHERE invalid_reason IS NOT NULL AND ("
        " gateway_id = $1 OR tenant_id IN (SELECT a.tenant_id FROM deployments d JOIN apis a"
        " ON a.api_id = d.api_id WHERE d.gateway_id = $1)) ORDER BY policy_id",
        gateway_id,
    )
    return [(r["policy_id"], r["invalid_reason"], r["tenant_id"]) for r in rows]
