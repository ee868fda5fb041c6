"""Changes: each gateway's complete inventory kept up to date from what changed, and the deltas between
its generations (the SSE `delta` events).

A gateway's state is read whole once per process (`Tracked.load`); from then on each new generation
reads only the rows written since the snapshot it was last read at (migration 0019: the writer's
transaction id on every row, removed keys in inventory_removals) and updates the elements, their
digests and the content hash (stoa_proto.inventory_delta) for what changed. The policies' `applicable`
lists are recomputed in memory, and only when the gateway's set of routes changed.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import asyncpg
from google.protobuf import json_format
from stoa_proto import INVENTORY_SCHEMA_VERSION, inventory_pb2
from stoa_proto.inventory_delta import LISTS, Elements, diff, key_of, removed_key

from stoa_cp.store.database import Database
from stoa_cp.store.inventory import (
    TOOLS,
    applicable,
    consumer_lists,
    issuer_message,
    policy_message,
    tool_message,
)

log = logging.getLogger("stoa_cp.changes")

# inventory_removals keeps a day; a state last read longer ago than this is read whole again.
RETENTION_S = 12 * 3600
# Deltas kept per gateway, so that a Link resuming a few generations back gets them, not everything.
HISTORY = 32


def _changed(snapshot: str) -> str:
    """Rows of `x` written by a transaction that had not committed in the snapshot `snapshot` (a
    parameter): the index on xid skips everything older than the snapshot's oldest running one."""
    return (
        f"(x.xid >= pg_snapshot_xmin({snapshot}::text::pg_snapshot)"
        f" AND NOT pg_visible_in_snapshot(x.xid, {snapshot}::text::pg_snapshot))"
    )


_ROUTE_COLUMNS = (
    "a.api_id, a.tenant_id, a.path_prefix, a.methods, a.upstream_url, a.timeout_ms, a.auth_mode,"
    " a.scopes, a.forward_credential, a.envelope, a.kind, a.key_header, a.subscription"
)
_ALL_ROUTES = (
    f"SELECT {_ROUTE_COLUMNS} FROM deployments d JOIN apis a ON a.api_id = d.api_id WHERE d.gateway_id = $1"  # noqa: S608
)
_CHANGED_ROUTES = f"""
SELECT {_ROUTE_COLUMNS} FROM deployments d JOIN apis a ON a.api_id = d.api_id
 WHERE d.gateway_id = $1 AND a.api_id IN (
       SELECT x.api_id FROM apis x WHERE {_changed("$2")}
       UNION ALL SELECT x.api_id FROM deployments x WHERE x.gateway_id = $1 AND {_changed("$2")})
"""  # noqa: S608
_POLICY_COLUMNS = "policy_id, type, config, scope, targets, tenant_id, gateway_id, invalid_reason"
_ISSUER_COLUMNS = "issuer_id, tenant_id, issuer, jwks, jwks_uri, stale"
_TENANT_ISSUERS = f"SELECT {_ISSUER_COLUMNS} FROM issuers WHERE tenant_id = ANY($1::text[]) AND NOT stale"  # noqa: S608
_SNAPSHOT = "SELECT generation, pg_current_snapshot()::text AS snapshot FROM gateways WHERE gateway_id = $1"


@dataclass
class Tracked:
    """One gateway's complete inventory as elements, with what it was derived from."""

    gateway_id: str
    elements: Elements
    snapshot: str  # the pg_snapshot it was read at
    read_at: float
    route_tenants: dict[str, str] = field(default_factory=dict)
    policy_rows: dict[str, Mapping[str, Any]] = field(default_factory=dict)  # the relevant policies
    issuer_keys: dict[str, tuple[str, str]] = field(default_factory=dict)  # issuer_id → inventory key
    mcp_routes: set[str] = field(default_factory=set)  # routes of kind mcp (their tenants' tools ship)
    # Routes per tenant (the tenants routed here), and whether a route came, went or changed tenant
    # since the policies' `applicable` lists were last computed.
    tenant_routes: Counter[str] = field(default_factory=Counter)
    routes_moved: bool = False

    @property
    def generation(self) -> int:
        return self.elements.generation

    @classmethod
    async def load(cls, conn: asyncpg.Connection, gateway_id: str) -> Tracked | None:
        """The gateway's state read whole, or None when the gateway does not exist."""
        async with conn.transaction(isolation="repeatable_read", readonly=True):
            head = await conn.fetchrow(_SNAPSHOT, gateway_id)
            if head is None:
                return None
            state = cls(
                gateway_id,
                Elements(INVENTORY_SCHEMA_VERSION, gateway_id, int(head["generation"])),
                head["snapshot"],
                time.monotonic(),
            )
            for row in await conn.fetch(_ALL_ROUTES, gateway_id):
                state._put_route(row)
            for row in await conn.fetch(
                "SELECT route_id, generation FROM tombstones WHERE gateway_id = $1", gateway_id
            ):
                state.elements.put("tombstones", _tombstone(row))
            tenants = sorted(state.tenant_routes)
            for row in await conn.fetch(
                f"SELECT {_POLICY_COLUMNS} FROM policies"  # noqa: S608
                " WHERE invalid_reason IS NULL AND (gateway_id = $1 OR tenant_id = ANY($2::text[]))",
                gateway_id,
                tenants,
            ):
                state.policy_rows[row["policy_id"]] = row
            for row in await conn.fetch(
                _TENANT_ISSUERS,
                tenants,
            ):
                state._put_issuer(row)
            await state._read_tools(conn)
            await state._read_consumers(conn)
        state._render_policies(state.policy_rows)
        return state

    async def advance(self, conn: asyncpg.Connection) -> inventory_pb2.InventoryDelta | None:
        """Bring the state to the gateway's current generation; the delta from the previous one, or
        None when the generation is unchanged. Raises LookupError when the gateway is gone."""
        if time.monotonic() - self.read_at > RETENTION_S:
            return await self._reread(conn)
        before: dict[tuple[str, object], int | None] = {}
        elements = self.elements
        base = self.generation

        def touch(name: str, key: object) -> None:
            if (name, key) not in before:
                held = elements.lists[name].get(key)
                before[name, key] = None if held is None else held[1]

        async with conn.transaction(isolation="repeatable_read", readonly=True):
            head = await conn.fetchrow(_SNAPSHOT, self.gateway_id)
            if head is None:
                raise LookupError(self.gateway_id)
            if int(head["generation"]) == self.generation:
                return None
            args = (self.gateway_id, self.snapshot)
            removals = await conn.fetch(
                f"SELECT kind, gateway_id, item FROM inventory_removals x WHERE {_changed('$1')}",  # noqa: S608
                self.snapshot,
            )
            routes = await conn.fetch(_CHANGED_ROUTES, *args)
            tombstones = await conn.fetch(
                f"SELECT route_id, generation FROM tombstones x WHERE x.gateway_id = $1 AND {_changed('$2')}",  # noqa: S608
                *args,
            )
            policies = await conn.fetch(
                f"SELECT {_POLICY_COLUMNS} FROM policies x WHERE {_changed('$1')}",  # noqa: S608
                self.snapshot,
            )
            issuers = await conn.fetch(
                f"SELECT {_ISSUER_COLUMNS} FROM issuers x WHERE {_changed('$1')}",  # noqa: S608
                self.snapshot,
            )
            tenants_before = set(self.tenant_routes)
            self.routes_moved = False
            # Removals first: a key removed and written again since the last read is present now.
            for row in removals:
                kind, item = row["kind"], row["item"]
                if kind == "route" and row["gateway_id"] == self.gateway_id:
                    touch("routes", item)
                    elements.remove("routes", item)
                    self._drop_route(item)
                    self.mcp_routes.discard(item)
                elif kind == "tombstone" and row["gateway_id"] == self.gateway_id:
                    touch("tombstones", item)
                    elements.remove("tombstones", item)
                elif kind == "policy":
                    self.policy_rows.pop(item, None)
                    touch("policies", item)
                    elements.remove("policies", item)
                elif kind == "issuer" and item in self.issuer_keys:
                    key = self.issuer_keys.pop(item)
                    touch("issuers", key)
                    elements.remove("issuers", key)
            for row in routes:
                touch("routes", row["api_id"])
                self._put_route(row)
            for row in tombstones:
                touch("tombstones", row["route_id"])
                elements.put("tombstones", _tombstone(row))
            tenants = set(self.tenant_routes)
            added_tenants = sorted(tenants - tenants_before)
            if added_tenants:
                # A tenant's first route here brings its policies and issuers, changed or not.
                policies = [
                    *policies,
                    *await conn.fetch(
                        f"SELECT {_POLICY_COLUMNS} FROM policies WHERE tenant_id = ANY($1::text[])",  # noqa: S608
                        added_tenants,
                    ),
                ]
                issuers = [
                    *issuers,
                    *await conn.fetch(
                        _TENANT_ISSUERS,
                        added_tenants,
                    ),
                ]
            await self._read_tools(conn, touch)
            await self._read_consumers(conn, touch)
        self.elements.generation = int(head["generation"])
        self.snapshot, self.read_at = head["snapshot"], time.monotonic()

        # Policies: the changed rows, and every held one when the tenants or the routes moved.
        rerender: dict[str, Mapping[str, Any]] = {}
        for row in policies:
            if row["invalid_reason"] is None and (
                row["gateway_id"] == self.gateway_id or row["tenant_id"] in tenants
            ):
                self.policy_rows[row["policy_id"]] = row
                rerender[row["policy_id"]] = row
            elif self.policy_rows.pop(row["policy_id"], None) is not None:
                touch("policies", row["policy_id"])
                elements.remove("policies", row["policy_id"])
        for policy_id, row in list(self.policy_rows.items()):
            if row["gateway_id"] != self.gateway_id and row["tenant_id"] not in tenants:
                del self.policy_rows[policy_id]
                touch("policies", policy_id)
                elements.remove("policies", policy_id)
        if self.routes_moved:
            rerender = dict(self.policy_rows)
        for policy_id in rerender:
            touch("policies", policy_id)
        self._render_policies(rerender)

        # Issuers: the changed rows, and the held ones of tenants no longer here.
        for row in issuers:
            key = self.issuer_keys.get(row["issuer_id"])
            if key is not None:
                touch("issuers", key)
                elements.remove("issuers", key)
                del self.issuer_keys[row["issuer_id"]]
            if row["tenant_id"] in tenants and not row["stale"]:
                touch("issuers", (row["tenant_id"], row["issuer"]))
                self._put_issuer(row)
        for issuer_id, key in list(self.issuer_keys.items()):
            if key[0] not in tenants:
                del self.issuer_keys[issuer_id]
                touch("issuers", key)
                elements.remove("issuers", key)

        delta = inventory_pb2.InventoryDelta(
            schema_version=elements.schema_version,
            gateway_id=self.gateway_id,
            generation=elements.generation,
            base_generation=base,
            inventory_hash=elements.hash(),
        )
        for (name, key), digest in sorted(before.items(), key=repr):
            held = elements.lists[name].get(key)
            if held is None:
                if digest is not None:
                    removed_key(delta, name, key)
            elif held[1] != digest:
                getattr(delta, name).append(held[0])
        return delta

    async def _reread(self, conn: asyncpg.Connection) -> inventory_pb2.InventoryDelta | None:
        """The state read whole again, and the delta computed by comparing both (rare: a state older
        than the removals kept)."""
        fresh = await Tracked.load(conn, self.gateway_id)
        if fresh is None:
            raise LookupError(self.gateway_id)
        if fresh.generation == self.generation:
            self.read_at = fresh.read_at
            return None
        delta = diff(self.elements.inventory(), fresh.elements.inventory())
        self.__dict__.update(fresh.__dict__)
        return delta

    def _drop_route(self, route_id: str) -> None:
        tenant = self.route_tenants.pop(route_id, None)
        if tenant is not None:
            self.routes_moved = True
            self.tenant_routes[tenant] -= 1
            if self.tenant_routes[tenant] <= 0:
                del self.tenant_routes[tenant]

    def _put_route(self, row: Mapping[str, Any]) -> None:
        if self.route_tenants.get(row["api_id"]) != row["tenant_id"]:
            self._drop_route(row["api_id"])
            self.route_tenants[row["api_id"]] = row["tenant_id"]
            self.tenant_routes[row["tenant_id"]] += 1
            self.routes_moved = True
        if row["kind"] == "mcp":
            self.mcp_routes.add(row["api_id"])
        else:
            self.mcp_routes.discard(row["api_id"])
        self.elements.put("routes", _route(row))

    async def _read_tools(
        self, conn: asyncpg.Connection, touch: Callable[[str, object], None] | None = None
    ) -> None:
        """The tools of the tenants with an MCP route here, read whole: they are few (a registry, not
        the routes) and each names its API's upstream, so any change of either is seen."""
        tenants = sorted({self.route_tenants[r] for r in self.mcp_routes})
        rows = await conn.fetch(TOOLS, tenants)
        fresh = {(row["tenant_id"], row["name"]): tool_message(row) for row in rows}
        for key in set(self.elements.keys("tools")) | fresh.keys():
            if touch is not None:
                touch("tools", key)
            if key in fresh:
                self.elements.put("tools", fresh[key])
            else:
                self.elements.remove("tools", key)

    async def _read_consumers(
        self, conn: asyncpg.Connection, touch: Callable[[str, object], None] | None = None
    ) -> None:
        """The consumers, subscriptions and revoked key digests of the tenants routed here, read whole
        by the inventory's own queries: a key, a plan or a subscription changes none of the rows the
        other lists are tracked by, and a revocation must never wait for one that does."""
        fresh = await consumer_lists(conn, sorted(self.tenant_routes), self.gateway_id)
        for name, elements in fresh.items():
            by_key = {key_of(name, element): element for element in elements}
            for key in set(self.elements.keys(name)) | by_key.keys():
                if touch is not None:
                    touch(name, key)
                if key in by_key:
                    self.elements.put(name, by_key[key])
                else:
                    self.elements.remove(name, key)

    def _put_issuer(self, row: Mapping[str, Any]) -> None:
        message = issuer_message(row)
        self.issuer_keys[row["issuer_id"]] = (message.tenant_id, message.issuer)
        self.elements.put("issuers", message)

    def _render_policies(self, rows: Iterable[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]]) -> None:
        values = list(rows.values() if isinstance(rows, Mapping) else rows)
        if not values:
            return  # the applicable lists below cost a walk of every route
        all_routes = sorted(self.route_tenants)
        by_tenant: dict[str, list[str]] = {}
        for route_id in all_routes:
            by_tenant.setdefault(self.route_tenants[route_id], []).append(route_id)
        for row in values:
            applies_to = applicable(row["scope"], row["tenant_id"], row["targets"], all_routes, by_tenant)
            self.elements.put("policies", policy_message(row, applies_to))


def _route(row: Mapping[str, Any]) -> inventory_pb2.Route:
    return inventory_pb2.Route(
        route_id=row["api_id"],
        tenant_id=row["tenant_id"],
        api_id=row["api_id"],
        path_prefix=row["path_prefix"],
        methods=row["methods"],
        upstream_url=row["upstream_url"],
        timeout_ms=row["timeout_ms"],
        auth_mode=row["auth_mode"],
        scopes=row["scopes"],
        forward_credential=row["forward_credential"],
        envelope=row["envelope"],
        kind="" if row["kind"] == "http" else row["kind"],
        key_header=row["key_header"],
        subscription=row["subscription"],
    )


def _tombstone(row: Mapping[str, Any]) -> inventory_pb2.Tombstone:
    return inventory_pb2.Tombstone(route_id=row["route_id"], generation=row["generation"])


def event_json(delta: inventory_pb2.InventoryDelta) -> str:
    """THE serialiser of a delta event: proto3 JSON, snake_case, one line (as the inventory's)."""
    return json_format.MessageToJson(delta, preserving_proto_field_name=True, indent=None)


@dataclass(frozen=True)
class Event:
    base_generation: int
    generation: int
    data: str


class DeltaTracker:
    """Per gateway: the tracked state and the latest deltas as events, advanced at most once per
    generation per process whatever the number of subscribers."""

    def __init__(self, max_gateways: int = 256) -> None:
        self._states: OrderedDict[str, tuple[Tracked, deque[Event]]] = OrderedDict()
        self._locks: dict[str, asyncio.Lock] = {}
        self._max = max_gateways

    async def since(
        self, db: Database, gateway_id: str, last_sent: int
    ) -> tuple[int, list[Event] | None] | None:
        """(current generation, the events from `last_sent` to it, or None when they are not held),
        or None when the gateway does not exist."""
        lock = self._locks.setdefault(gateway_id, asyncio.Lock())
        async with lock, db.connection() as conn:
            entry = self._states.get(gateway_id)
            try:
                if entry is None:
                    state = await Tracked.load(conn, gateway_id)
                    if state is None:
                        return None
                    entry = (state, deque(maxlen=HISTORY))
                    self._remember(gateway_id, entry)
                else:
                    await self._advance(gateway_id, *entry, conn)
            except LookupError:
                self._forget(gateway_id)
                return None
        state, history = entry
        self._states.move_to_end(gateway_id)
        if last_sent >= state.generation:
            return state.generation, []
        chain = [event for event in history if event.generation > last_sent]
        if not chain or chain[0].base_generation != last_sent:
            return state.generation, None
        return state.generation, chain

    async def _advance(
        self, gateway_id: str, state: Tracked, history: deque[Event], conn: asyncpg.Connection
    ) -> None:
        started = time.perf_counter()
        delta = await state.advance(conn)
        if delta is None:
            return
        data = event_json(delta)
        history.append(Event(delta.base_generation, delta.generation, data))
        log.info(
            "inventory_delta gateway=%s generation=%d base=%d changed=%d removed=%d bytes=%d ms=%.1f",
            gateway_id,
            delta.generation,
            delta.base_generation,
            sum(len(getattr(delta, name)) for name in LISTS),
            sum(len(getattr(delta, f"removed_{name}")) for name in LISTS),
            len(data),
            (time.perf_counter() - started) * 1000,
        )

    def _remember(self, gateway_id: str, entry: tuple[Tracked, deque[Event]]) -> None:
        self._states[gateway_id] = entry
        while len(self._states) > self._max:
            evicted, _ = self._states.popitem(last=False)
            self._locks.pop(evicted, None)

    def _forget(self, gateway_id: str) -> None:
        self._states.pop(gateway_id, None)


async def prune(conn: asyncpg.Connection) -> None:
    """Forget removals older than the retention of inventory_removals (a day)."""
    await conn.execute("DELETE FROM inventory_removals WHERE removed_at < now() - interval '1 day'")
