"""Inventory: a gateway's complete desired state, read from the store in one consistent snapshot.

A fixed handful of queries per build whatever the number of routes (no per-route queries), and one
serialised document per (gateway, generation) shared by /config and every SSE subscriber: content only
changes together with the generation, so a cached body for a generation is always current.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import OrderedDict

import asyncpg
from google.protobuf import json_format
from stoa_proto import inventory_pb2

log = logging.getLogger("stoa_cp.inventory")


async def build(conn: asyncpg.Connection, gateway_id: str) -> inventory_pb2.Inventory | None:
    """The gateway's inventory, or None when the gateway does not exist."""
    async with conn.transaction(isolation="repeatable_read", readonly=True):
        generation = await conn.fetchval("SELECT generation FROM gateways WHERE gateway_id = $1", gateway_id)
        if generation is None:
            return None
        routes = await conn.fetch(
            "SELECT a.api_id, a.tenant_id, a.path_prefix, a.methods, a.upstream_url, a.timeout_ms,"
            " a.auth_mode, a.scopes FROM deployments d JOIN apis a ON a.api_id = d.api_id"
            " WHERE d.gateway_id = $1 ORDER BY a.api_id",
            gateway_id,
        )
        tenants = sorted({row["tenant_id"] for row in routes})
        tombstones = await conn.fetch(
            "SELECT route_id, generation FROM tombstones WHERE gateway_id = $1 ORDER BY route_id", gateway_id
        )
        policies = await conn.fetch(
            "SELECT policy_id, type, config, scope, targets, tenant_id FROM policies"
            " WHERE gateway_id = $1 OR tenant_id = ANY($2::text[]) ORDER BY policy_id",
            gateway_id,
            tenants,
        )
        issuers = await conn.fetch(
            "SELECT tenant_id, issuer, jwks, jwks_uri FROM issuers"
            " WHERE tenant_id = ANY($1::text[]) ORDER BY tenant_id, issuer",
            tenants,
        )

    inv = inventory_pb2.Inventory(gateway_id=gateway_id, generation=int(generation))
    by_tenant: dict[str, list[str]] = {}
    for row in routes:
        inv.routes.add(
            route_id=row["api_id"],
            tenant_id=row["tenant_id"],
            api_id=row["api_id"],
            path_prefix=row["path_prefix"],
            methods=row["methods"],
            upstream_url=row["upstream_url"],
            timeout_ms=row["timeout_ms"],
            auth_mode=row["auth_mode"],
            scopes=row["scopes"],
        )
        by_tenant.setdefault(row["tenant_id"], []).append(row["api_id"])
    all_routes = [row["api_id"] for row in routes]
    for row in tombstones:
        inv.tombstones.add(route_id=row["route_id"], generation=int(row["generation"]))
    for row in policies:
        policy = inv.policies.add(
            policy_id=row["policy_id"],
            type=row["type"],
            scope=row["scope"],
            targets=row["targets"],
            tenant_id=row["tenant_id"] or "",
            applicable=applicable(row["scope"], row["tenant_id"], row["targets"], all_routes, by_tenant),
        )
        policy.config.update(row["config"])
    for row in issuers:
        inv.issuers.add(
            tenant_id=row["tenant_id"],
            issuer=row["issuer"],
            jwks_json=json.dumps(row["jwks"], sort_keys=True, separators=(",", ":")),
            jwks_uri=row["jwks_uri"] or "",
        )
    return inv


def applicable(
    scope: str,
    tenant_id: str | None,
    targets: list[str],
    all_routes: list[str],
    by_tenant: dict[str, list[str]],
) -> list[str]:
    """Route ids a policy applies to on one gateway. An api policy never broadens beyond its targets."""
    if scope == "gateway":
        return list(all_routes)
    own = by_tenant.get(tenant_id or "", [])
    if scope == "tenant":
        return list(own)
    wanted = set(targets)
    return [route_id for route_id in own if route_id in wanted]


def to_json(inv: inventory_pb2.Inventory) -> str:
    """THE serialiser of the inventory (config endpoint and SSE): proto3 JSON, snake_case, one line."""
    doc = json_format.MessageToDict(
        inv, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    return json.dumps(doc, separators=(",", ":"))


class InventoryCache:
    """Latest serialised inventory per gateway, built at most once per generation per process."""

    def __init__(self, max_gateways: int = 256) -> None:
        self._entries: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._max = max_gateways

    async def current(self, pool: asyncpg.Pool, gateway_id: str) -> tuple[int, str] | None:
        """(generation, inventory JSON) of the gateway now, or None when it does not exist."""
        lock = self._locks.setdefault(gateway_id, asyncio.Lock())
        async with lock, pool.acquire() as conn:
            generation = await conn.fetchval(
                "SELECT generation FROM gateways WHERE gateway_id = $1", gateway_id
            )
            if generation is None:
                self._entries.pop(gateway_id, None)
                return None
            cached = self._entries.get(gateway_id)
            if cached is not None and cached[0] == generation:
                self._entries.move_to_end(gateway_id)
                return cached
            started = time.perf_counter()
            inv = await build(conn, gateway_id)
            if inv is None:
                return None
            built = time.perf_counter()
            entry = (int(inv.generation), to_json(inv))
            log.info(
                "inventory_built gateway=%s generation=%d routes=%d bytes=%d build_ms=%.1f serialise_ms=%.1f",
                gateway_id,
                entry[0],
                len(inv.routes),
                len(entry[1]),
                (built - started) * 1000,
                (time.perf_counter() - built) * 1000,
            )
            self._entries[gateway_id] = entry
            self._entries.move_to_end(gateway_id)
            while len(self._entries) > self._max:
                evicted, _ = self._entries.popitem(last=False)
                self._locks.pop(evicted, None)
            return entry
