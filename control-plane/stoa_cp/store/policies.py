"""Policies: tenant/api-scoped under a tenant, gateway-scoped under a gateway.

Reach (which inventories list a policy, hence which gateways a change bumps): a gateway-scoped policy is
listed on its gateway; a tenant- or api-scoped policy on every gateway where its tenant has a route.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

import asyncpg
from stoa_translate.policies import ConfigError, UnsupportedKind, accept_json

from stoa_cp import policy_config
from stoa_cp.problems import Problem
from stoa_cp.schemas import (
    GatewayPolicyFields,
    GatewayPolicyIn,
    PolicyOut,
    TenantPolicyFields,
    TenantPolicyIn,
)
from stoa_cp.store import apis
from stoa_cp.store.inventory import applicable
from stoa_cp.store.publication import bump, tenant_gateways
from stoa_cp.store.tenant_objects import GATEWAY, Kind, Objects, Services, Values

log = logging.getLogger("stoa_cp")


async def _check_targets(conn: asyncpg.Connection, tenant_id: str, body: TenantPolicyFields) -> Values:
    """404 naming each target of an api-scoped policy that is not an API of the tenant (a rule on the
    stored state, so not the 422 of a malformed body; another tenant's API is as unknown as none)."""
    if body.scope != "api":
        return {}
    [errors] = await apis.unknown(conn, tenant_id, [("targets", body.targets)])
    if errors:
        raise Problem(404, "Not found", errors)
    return {}


def _tenant_values(body: TenantPolicyFields) -> Values:
    return {
        "type": body.type,
        "config": body.config,
        "scope": body.scope,
        "targets": sorted(set(body.targets)),
    }


def _gateway_values(body: GatewayPolicyFields) -> Values:
    return {"type": body.type, "config": body.config, "scope": "gateway", "targets": []}


async def _no_tenant_overlap(conn: asyncpg.Connection, tenant_id: str, policy_id: str, _body: object) -> None:
    await refuse_overlaps(conn, await tenant_gateways(conn, tenant_id), policy_id=policy_id)


async def _no_gateway_overlap(
    conn: asyncpg.Connection, gateway_id: str, policy_id: str, _body: object
) -> None:
    await refuse_overlaps(conn, [gateway_id], policy_id=policy_id)


def _accepted(body: Any, policy_id: str, services: Services) -> dict[str, Any]:
    """The config in the normal form the site's rules give it (422 naming the field if they refuse,
    or when a list of it is longer than its limit)."""
    config = body.config.model_dump(exclude_unset=True, by_alias=True)
    return policy_config.accepted(body.type, policy_id, config, services.settings.policy_limits)


def _tenant_policy(body: Any, policy_id: str, services: Services) -> TenantPolicyIn:
    config = _accepted(body, policy_id, services)
    return TenantPolicyIn(
        policy_id=policy_id, type=body.type, config=config, scope=body.scope, targets=body.targets
    )


def _gateway_policy(body: Any, policy_id: str, services: Services) -> GatewayPolicyIn:
    return GatewayPolicyIn(policy_id=policy_id, type=body.type, config=_accepted(body, policy_id, services))


# policy_id is unique across tenants and gateways; an identical create answers the stored policy.
TENANT_POLICIES = Kind(
    table="policies",
    key="policy_id",
    columns=("type", "config", "scope", "targets", "gateway_id"),
    model=PolicyOut,
    values=_tenant_values,
    check=_check_targets,
    written=_no_tenant_overlap,
    unique_across_tenants=True,
    repeatable=True,
    # A policy stored before typed configs and refused by the rules is invalid until a PUT replaces it.
    stale_column="invalid_reason",
    set_on_replace="updated_at = now(), config_schema = 2",
)
GATEWAY_POLICIES = replace(
    TENANT_POLICIES, owner=GATEWAY, values=_gateway_values, check=None, written=_no_gateway_overlap
)
tenant_policies = Objects(TENANT_POLICIES, prepare=_tenant_policy)
gateway_policies = Objects(GATEWAY_POLICIES, prepare=_gateway_policy)


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
