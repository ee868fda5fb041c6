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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import asyncpg
from google.protobuf import json_format
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2, mcp_pb2
from stoa_translate.policies import KINDS, read_config

from stoa_cp.store.database import Database

log = logging.getLogger("stoa_cp.inventory")


# JSON text of a value by kind, and the test for the kind's proto3 default.
_KINDS = {
    "string": ("to_json({0})::text", "{0} = ''"),
    "strings": ("array_to_json({0})::text", "cardinality({0}) = 0"),
    "uint32": ("{0}::text", "{0} = 0"),
    "int64": ("'\"' || {0}::text || '\"'", "{0} = 0"),  # proto3 JSON writes int64 as a string
    "bool": ("to_json({0})::text", "NOT {0}"),
}


def _json_object(fields: tuple[tuple[str, str, str], ...]) -> str:
    """SQL for one message as json_format + `json.dumps(separators=(",", ":"))` write it: snake_case
    keys, every field present, the fields that are set first and the defaults after, each group in
    field order. Only non-ASCII text differs (UTF-8 here, \\u escapes there: the same JSON)."""
    members = []
    for is_default in (False, True):
        for key, column, kind in fields:
            value, default = (template.format(column) for template in _KINDS[kind])
            test = default if is_default else f"NOT ({default})"
            members.append(f"CASE WHEN {test} THEN '\"{key}\":' || {value} END")
    return "'{' || concat_ws(',', " + ", ".join(members) + ") || '}'"


# The two lists that grow with the estate are written by PostgreSQL itself, one aggregate each:
# building 10,000 route objects through protobuf and dicts in Python cost ~100 ms per generation.
# (S608: the SQL is composed at import from the literal field tables here, never from input.)
_ROUTES = f"""
SELECT coalesce(string_agg({
    _json_object(
        (
            ("route_id", "a.api_id", "string"),
            ("tenant_id", "a.tenant_id", "string"),
            ("api_id", "a.api_id", "string"),
            ("path_prefix", "a.path_prefix", "string"),
            ("methods", "a.methods", "strings"),
            ("upstream_url", "a.upstream_url", "string"),
            ("timeout_ms", "a.timeout_ms", "uint32"),
            ("auth_mode", "a.auth_mode", "string"),
            ("scopes", "a.scopes", "strings"),
            ("forward_credential", "a.forward_credential", "bool"),
            ("envelope", "a.envelope", "bool"),
            ("kind", "CASE WHEN a.kind = 'http' THEN '' ELSE a.kind END", "string"),
            ("key_header", "a.key_header", "string"),
            ("subscription", "a.subscription", "bool"),
        )
    )
}, ',' ORDER BY a.api_id), '') AS json,
       coalesce(array_agg(a.api_id ORDER BY a.api_id), '{{}}') AS route_ids,
       coalesce(array_agg(a.tenant_id ORDER BY a.api_id), '{{}}') AS tenant_ids,
       coalesce(array_agg(DISTINCT a.tenant_id) FILTER (WHERE a.kind = 'mcp'), '{{}}') AS mcp_tenants
  FROM deployments d JOIN apis a ON a.api_id = d.api_id
 WHERE d.gateway_id = $1
"""  # noqa: S608
_TOMBSTONES = f"""
SELECT coalesce(string_agg({
    _json_object(
        (
            ("route_id", "route_id", "string"),
            ("generation", "generation", "int64"),
        )
    )
}, ',' ORDER BY route_id), '')
  FROM tombstones WHERE gateway_id = $1
"""  # noqa: S608


@dataclass(frozen=True)
class Document:
    """A gateway's inventory: the small parts as a message, the large lists as JSON array bodies."""

    inventory: inventory_pb2.Inventory  # without routes and tombstones
    routes_json: str
    tombstones_json: str
    route_count: int


async def build(conn: asyncpg.Connection, gateway_id: str) -> Document | None:
    """The gateway's inventory, or None when the gateway does not exist. Runs inside the caller's
    repeatable-read transaction: every query below sees one snapshot."""
    generation = await conn.fetchval("SELECT generation FROM gateways WHERE gateway_id = $1", gateway_id)
    if generation is None:
        return None
    routes = await conn.fetchrow(_ROUTES, gateway_id)
    tenants = sorted(set(routes["tenant_ids"]))
    tombstones = await conn.fetchval(_TOMBSTONES, gateway_id)
    policies = await conn.fetch(
        "SELECT policy_id, type, config, scope, targets, tenant_id FROM policies"
        " WHERE invalid_reason IS NULL AND (gateway_id = $1 OR tenant_id = ANY($2::text[]))"
        " ORDER BY policy_id",
        gateway_id,
        tenants,
    )
    issuers = await conn.fetch(
        "SELECT tenant_id, issuer, jwks, jwks_uri FROM issuers"
        " WHERE tenant_id = ANY($1::text[]) AND NOT stale ORDER BY tenant_id, issuer",
        tenants,
    )
    tools = await conn.fetch(TOOLS, list(routes["mcp_tenants"]))
    consumer_data = await consumer_lists(conn, tenants, gateway_id)

    inv = inventory_pb2.Inventory(
        schema_version=INVENTORY_SCHEMA_VERSION, gateway_id=gateway_id, generation=int(generation)
    )
    all_routes: list[str] = routes["route_ids"]
    by_tenant: dict[str, list[str]] = {}
    for route_id, tenant_id in zip(all_routes, routes["tenant_ids"], strict=True):
        by_tenant.setdefault(tenant_id, []).append(route_id)
    for row in policies:
        inv.policies.append(
            policy_message(
                row, applicable(row["scope"], row["tenant_id"], row["targets"], all_routes, by_tenant)
            )
        )
    inv.issuers.extend(issuer_message(row) for row in issuers)
    for row in tools:
        inv.tools.append(tool_message(row))
    for name, elements in consumer_data.items():
        getattr(inv, name).extend(elements)
    return Document(inv, routes["json"], tombstones, len(all_routes))


async def consumer_lists(
    conn: asyncpg.Connection, tenants: list[str], gateway_id: str
) -> dict[str, list[Any]]:
    """The inventory's consumers (with their live keys' digests) and revoked key digests of `tenants`,
    and the subscriptions to the APIs deployed on `gateway_id` with their plans' figures (the full build
    and the deltas; by a join, not a list of 10,000 route ids sent with every generation)."""
    consumers = await conn.fetch(
        "SELECT c.tenant_id, c.consumer_id, c.client_ids,"
        " coalesce((SELECT array_agg(encode(k.key_sha256, 'hex') ORDER BY k.key_sha256) FROM api_keys k"
        " WHERE k.tenant_id = c.tenant_id AND k.consumer_id = c.consumer_id AND k.revoked_at IS NULL),"
        " '{}') AS keys FROM consumers c WHERE c.tenant_id = ANY($1::text[])"
        " ORDER BY c.tenant_id, c.consumer_id",
        tenants,
    )
    subscriptions = await conn.fetch(
        "SELECT s.tenant_id, s.subscription_id, s.consumer_id, s.api_id, s.plan_id,"
        " s.state = 'active' AS active, p.requests, p.window_seconds, p.billed"
        " FROM subscriptions s JOIN plans p ON p.tenant_id = s.tenant_id AND p.plan_id = s.plan_id"
        " WHERE s.api_id IN (SELECT d.api_id FROM deployments d WHERE d.gateway_id = $1)"
        " ORDER BY s.tenant_id, s.subscription_id",
        gateway_id,
    )
    revoked = await conn.fetchval(
        "SELECT coalesce(array_agg(encode(key_sha256, 'hex') ORDER BY key_sha256), '{}') FROM api_keys"
        " WHERE tenant_id = ANY($1::text[]) AND revoked_at IS NOT NULL",
        tenants,
    )
    return {
        "consumers": [
            inventory_pb2.Consumer(
                tenant_id=row["tenant_id"],
                consumer_id=row["consumer_id"],
                client_ids=row["client_ids"],
                key_sha256=row["keys"],
            )
            for row in consumers
        ],
        "subscriptions": [inventory_pb2.Subscription(**dict(row)) for row in subscriptions],
        "revoked_key_sha256": list(revoked),
    }


# The tools of the tenants that have an MCP route on the gateway, with their API's upstream.
TOOLS = (
    "SELECT t.tenant_id, t.name, t.description, t.input_schema, t.output_schema, t.annotations, t.api_id,"
    " t.method, t.path_template, a.upstream_url, a.timeout_ms, t.budget_calls, t.budget_window_s"
    " FROM tools t JOIN apis a ON a.api_id = t.api_id"
    " WHERE t.tenant_id = ANY($1::text[]) ORDER BY t.tenant_id, t.name"
)


def _json_text(value: object) -> str:
    return "" if value is None else json.dumps(value, sort_keys=True, separators=(",", ":"))


def tool_message(row: asyncpg.Record) -> mcp_pb2.Tool:
    return mcp_pb2.Tool(
        tenant_id=row["tenant_id"],
        name=row["name"],
        description=row["description"],
        input_schema_json=_json_text(row["input_schema"]),
        output_schema_json=_json_text(row["output_schema"]),
        annotations_json=_json_text(row["annotations"]),
        api_id=row["api_id"],
        method=row["method"],
        path_template=row["path_template"],
        upstream_url=row["upstream_url"],
        timeout_ms=row["timeout_ms"] or 0,
        budget_calls=row["budget_calls"] or 0,
        budget_window_s=row["budget_window_s"] or 0,
    )


def policy_message(row: Mapping[str, Any], applies_to: list[str]) -> inventory_pb2.Policy:
    """A policy row (policy_id, type, config, scope, targets, tenant_id) as the inventory holds it."""
    policy = inventory_pb2.Policy(
        policy_id=row["policy_id"],
        type=row["type"],
        scope=row["scope"],
        targets=row["targets"],
        tenant_id=row["tenant_id"] or "",
        applicable=applies_to,
    )
    # Stored in normal form by the same rules: reading it into its typed member cannot fail.
    getattr(policy, row["type"]).CopyFrom(read_config(KINDS[row["type"]], row["config"]))
    return policy


def issuer_message(row: Mapping[str, Any]) -> inventory_pb2.TrustedIssuer:
    """An issuer row (tenant_id, issuer, jwks, jwks_uri) as the inventory holds it."""
    return inventory_pb2.TrustedIssuer(
        tenant_id=row["tenant_id"],
        issuer=row["issuer"],
        jwks_json=json.dumps(row["jwks"], sort_keys=True, separators=(",", ":")),
        jwks_uri=row["jwks_uri"] or "",
    )


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


def to_json(document: Document) -> str:
    """THE serialiser of the inventory (config endpoint and SSE): proto3 JSON, snake_case, one line."""
    lists = {"routes": document.routes_json, "tombstones": document.tombstones_json}
    # json_format writes the fields that are set first, then the empty ones: a stand-in element in
    # each non-empty list puts its key where json_format would, and the built body replaces it.
    shape = inventory_pb2.Inventory()
    shape.CopyFrom(document.inventory)
    for name, body in lists.items():
        if body:
            getattr(shape, name).add()
    doc = json_format.MessageToDict(
        shape, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    members = (
        f"{json.dumps(key)}:[{lists[key]}]" if key in lists else f"{json.dumps(key)}:{_compact(value)}"
        for key, value in doc.items()
    )
    return "{" + ",".join(members) + "}"


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


class InventoryCache:
    """Latest serialised inventory per gateway, built at most once per generation per process."""

    def __init__(self, max_gateways: int = 256) -> None:
        self._entries: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._max = max_gateways

    async def current(self, db: Database, gateway_id: str) -> tuple[int, str] | None:
        """(generation, inventory JSON) of the gateway now, or None when it does not exist."""
        lock = self._locks.setdefault(gateway_id, asyncio.Lock())
        async with lock, db.transaction(isolation="repeatable_read", readonly=True) as conn:
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
            document = await build(conn, gateway_id)
            if document is None:
                return None
            built = time.perf_counter()
            entry = (int(document.inventory.generation), to_json(document))
            log.info(
                "inventory_built gateway=%s generation=%d routes=%d bytes=%d build_ms=%.1f serialise_ms=%.1f",
                gateway_id,
                entry[0],
                document.route_count,
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
