"""A translation kept up to date by an inventory change (the CP's delta), for what a change usually is:
routes added, edited or removed, and tombstones.

`Kept` holds what a full translation implies per route (its resolved IR, its rendered entries, the table
it sits in, its policy-set entry) and the site-wide facts other resources are rendered from (tenants,
placements, backends, scope keys), each as an index or a count. A change then validates, resolves and
renders the routes it names, rebuilds the route tables they leave or join, and takes every other
resource as the same object, so it costs those routes, not the 10,000 others.

`Kept.apply` gives None, and the caller translates the complete inventory, for anything else: a change
of policies, issuers, tools, consumers, subscriptions or revocations; a changed route that a policy
names, or of kind mcp; one that changes the site-wide facts (the tenants present, the placements used,
the tenants whose tokens jwt_authn verifies, whether routes go by scope: some of them are no longer
what the listener is rendered from, and a change of them takes the full path all the same). What it
refuses, it refuses as `ir.build` would, in the same words; what it gives equals the full translation
(tested on random changes).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from envoy.config.route.v3 import route_components_pb2, route_pb2, scoped_route_pb2
from google.protobuf.message import Message
from stoa_proto import inventory_pb2
from stoa_proto.inventory_delta import Elements

from stoa_translate import ir, mcp
from stoa_translate.clusters import backend_clusters
from stoa_translate.decision import placement
from stoa_translate.options import TranslateOptions
from stoa_translate.policy_set import render_bucket, route_bucket, route_entry
from stoa_translate.refusal import FailureReason, Refusal, invalid
from stoa_translate.routes import (
    ROUTE_CONFIG_NAME,
    route_entries,
    route_table,
    scope,
    scope_key,
    scoped,
    table_name,
)
from stoa_translate.snapshot import (
    AUTHZ_POLICY_SET,
    CLUSTER,
    MCP_POLICY_SET,
    PROC_POLICY_SET,
    ROUTE,
    SCOPED_ROUTE,
    Snapshot,
    clusters_named,
    resource_name,
)

# The inventory's lists a change may touch and still be applied here.
ROUTE_LISTS = ("routes", "tombstones")
_OTHER_LISTS = ("policies", "issuers", "tools", "consumers", "subscriptions", "revoked_key_sha256")


def _order(route: ir.RouteIR) -> tuple[int, str]:
    """A route's position in its table (longest prefix first, as `render_routes` orders them)."""
    return (-len(route.path_prefix), route.route_id)


def _verified(route: ir.RouteIR) -> bool:
    return route.placement in placement.TOKEN_BY_ENVOY and route.auth_mode == "jwt"


@dataclass
class Kept:
    """What a translation implies per route and per site, kept for the next change (see the module)."""

    options: TranslateOptions
    site: ir.SiteIR  # the last full translation's site: what a route change leaves alone
    generation: int
    by_scope: bool
    proc_version: str | None
    verifiable: frozenset[str]
    trust: dict[str, placement.Trust]
    routes: dict[str, ir.RouteIR]
    bodies: dict[str, bytes]  # route id → its rendered entries (a VirtualHost holding only them)
    prefixes: dict[str, str]
    claimed: frozenset[str]  # route ids some policy lists
    tenants: Counter[str]
    placements: Counter[str]
    verified_tenants: Counter[str]
    envoy_verified: int
    unkeyed: set[str]
    backends: Counter[str]
    backend_of: dict[str, ir.Backend]
    rows: dict[str, dict[str, tuple[tuple[int, str], bytes]]]  # table → route id → (order, body)
    well_known: dict[str, list[route_components_pb2.Route]]
    uses_processing: frozenset[str]
    tables: dict[str, route_pb2.RouteConfiguration]
    keys: Counter[str]
    key_list: list[str]
    scope_list: list[scoped_route_pb2.ScopedRouteConfiguration]
    entries: dict[str, dict[str, bytes]]  # policy-set bucket → route id → the route's entry
    buckets: dict[str, Message]  # policy-set bucket → its resource
    previous: Snapshot

    @classmethod
    def of(
        cls,
        site: ir.SiteIR,
        options: TranslateOptions,
        proc_version: str | None,
        rendered: dict[ir.RouteIR, bytes],
        inventory: inventory_pb2.Inventory,
        snapshot: Snapshot,
    ) -> Kept:
        """The indexes of the full translation of `inventory` (`site`, `rendered`) to `snapshot`, each
        made by one comprehension over the routes (10,000 of them, once per full translation)."""
        by_scope = scoped(site, options)
        routes = site.routes
        keys = [scope_key(r.path_prefix) for r in routes]
        tables = [table_name(k or "") for k in keys] if by_scope else [ROUTE_CONFIG_NAME] * len(routes)
        bodies = [rendered[r] for r in routes]
        rows: dict[str, dict[str, tuple[tuple[int, str], bytes]]] = {}
        for route, table, body in zip(routes, tables, bodies, strict=True):
            rows.setdefault(table, {})[route.route_id] = ((-len(route.path_prefix), route.route_id), body)
        verified = [r for r in routes if _verified(r)]
        served = [r for r in routes if r.kind != ir.MCP_KIND]
        well_known: dict[str, list[route_components_pb2.Route]] = {}
        key_counts = Counter(k or "" for k in keys)
        for entry in mcp.well_known_entries(site):
            key = scope_key(entry.match.path) or ""
            key_counts[key] += 1
            well_known.setdefault(table_name(key) if by_scope else ROUTE_CONFIG_NAME, []).append(entry)
        return cls(
            options=options,
            site=site,
            generation=site.generation,
            by_scope=by_scope,
            proc_version=proc_version,
            verifiable=placement.verifiable_tenants(site.issuers),
            trust=placement.trust_by_tenant(site.issuers),
            routes={r.route_id: r for r in routes},
            bodies={r.route_id: body for r, body in zip(routes, bodies, strict=True)},
            prefixes={r.path_prefix: r.route_id for r in routes},
            claimed=frozenset(i for p in inventory.policies for i in p.applicable),
            tenants=Counter(r.tenant_id for r in routes),
            placements=Counter(r.placement for r in routes),
            verified_tenants=Counter(r.tenant_id for r in verified),
            envoy_verified=sum(1 for r in verified if r.placement == placement.ENVOY),
            unkeyed={r.route_id for r, k in zip(routes, keys, strict=True) if k is None},
            backends=Counter(r.backend.cluster_name for r in served),
            backend_of={r.backend.cluster_name: r.backend for r in served},
            rows=rows,
            well_known=well_known,
            uses_processing=frozenset(
                t for r, t in zip(routes, tables, strict=True) if r.policies and r.uses_processing()
            ),
            tables={t.name: t for t in snapshot.of(ROUTE)},  # type: ignore[attr-defined]
            keys=key_counts,
            key_list=sorted(key_counts) if by_scope else [],
            scope_list=list(snapshot.of(SCOPED_ROUTE)),  # type: ignore[arg-type]
            entries=_entries(routes),
            buckets={resource_name(r): r for r in snapshot.of(AUTHZ_POLICY_SET)[1:]},
            previous=snapshot,
        )

    def table_of(self, route: ir.RouteIR) -> str:
        return table_name(scope_key(route.path_prefix) or "") if self.by_scope else ROUTE_CONFIG_NAME

    def _add(self, route: ir.RouteIR, body: bytes) -> None:
        self.routes[route.route_id] = route
        self.bodies[route.route_id] = body
        self.prefixes[route.path_prefix] = route.route_id
        self.tenants[route.tenant_id] += 1
        self.placements[route.placement] += 1
        if _verified(route):
            self.verified_tenants[route.tenant_id] += 1
            self.envoy_verified += route.placement == placement.ENVOY
        key = scope_key(route.path_prefix)
        if key is None:
            self.unkeyed.add(route.route_id)
        if route.kind != ir.MCP_KIND:
            self.backends[route.backend.cluster_name] += 1
            self.backend_of[route.backend.cluster_name] = route.backend
        self.rows.setdefault(self.table_of(route), {})[route.route_id] = (_order(route), body)
        self.keys[key or ""] += 1

    def _remove(self, route: ir.RouteIR) -> None:
        del self.routes[route.route_id], self.bodies[route.route_id]
        if self.prefixes.get(route.path_prefix) == route.route_id:
            del self.prefixes[route.path_prefix]
        _decrement(self.tenants, route.tenant_id)
        _decrement(self.placements, route.placement)
        if _verified(route):
            _decrement(self.verified_tenants, route.tenant_id)
            self.envoy_verified -= route.placement == placement.ENVOY
        self.unkeyed.discard(route.route_id)
        if route.kind != ir.MCP_KIND:
            _decrement(self.backends, route.backend.cluster_name)
        rows = self.rows[self.table_of(route)]
        del rows[route.route_id]
        _decrement(self.keys, scope_key(route.path_prefix) or "")

    # ---- a change ------------------------------------------------------------------------------

    def apply(
        self,
        delta: inventory_pb2.InventoryDelta,
        state: Elements,
        resolved: dict[bytes, ir.RouteIR],
        rendered: dict[ir.RouteIR, bytes],
    ) -> Snapshot | None:
        """The snapshot of `state` (the complete inventory `delta` gives, applied to the one this was
        kept for), or None when the change is not one this path takes (see the module). Raises
        `Refusal` as `ir.build` would; nothing is changed here unless a snapshot is returned.
        `resolved`, `rendered`: the translator's memos, updated for the routes rendered here."""
        if delta.base_generation != self.generation or delta.gateway_id != self.site.gateway_id:
            return None
        if any(getattr(delta, n) or getattr(delta, f"removed_{n}") for n in _OTHER_LISTS):
            return None
        named = {r.route_id for r in delta.routes} | set(delta.removed_routes)
        if not named.isdisjoint(self.claimed):
            return None
        new = self._resolve(sorted(named), state, resolved)
        for route_id in sorted({t.route_id for t in delta.tombstones}):
            if state.get("routes", route_id) is not None and route_id not in named:
                raise invalid(f"route {route_id}: both present and tombstoned")
        old = {i: self.routes[i] for i in named if i in self.routes}
        if not self._same_site(old, new):
            return None
        self._check_prefixes(old, new)
        entries_before = {i: route_entry(r) for i, r in old.items()}
        entries_after = {i: route_entry(r) for i, r in new.items() if r is not None}
        buckets_changed = {
            route_bucket(i)
            for i in entries_before.keys() | entries_after.keys()
            if entries_before.get(i) != entries_after.get(i)
        }

        # Nothing refused: from here on the kept state moves to the new generation.
        touched: set[str] = set()
        # The scope keys the change may bring or take away, with how many routes (or entries) hold each.
        affected = {scope_key(r.path_prefix) or "" for r in (*old.values(), *new.values()) if r is not None}
        held_before = {key: self.keys.get(key, 0) for key in affected}
        backends_before = set(self.backends)
        for route in old.values():
            touched.add(self.table_of(route))
            self._remove(route)
            self._remove_entry(route.route_id)
        bodies: list[bytes] = []
        for route in new.values():
            if route is None:
                continue
            body = rendered.get(route)
            if body is None:
                entries = route_entries(route, self.options)
                body = route_components_pb2.VirtualHost(routes=entries).SerializeToString()
                rendered[route] = body
            self._add(route, body)
            self._add_entry(route)
            touched.add(self.table_of(route))
            bodies.append(body)
        self.generation = delta.generation
        keys_gone = {key for key, count in held_before.items() if count and key not in self.keys}
        keys_new = {key for key, count in held_before.items() if not count and key in self.keys}
        snapshot = self._snapshot(
            delta.generation, touched, keys_gone, keys_new, backends_before, buckets_changed
        )
        clusters = {c.name for c in snapshot.of(CLUSTER)}  # type: ignore[attr-defined]
        for body in bodies:
            missing = clusters_named(route_components_pb2.VirtualHost.FromString(body).routes) - clusters
            if missing:
                raise Refusal(
                    FailureReason.INCONSISTENT_SNAPSHOT,
                    "; ".join(f"a route names missing cluster {name}" for name in sorted(missing)),
                )
        return snapshot

    def _resolve(
        self, named: list[str], state: Elements, resolved: dict[bytes, ir.RouteIR]
    ) -> dict[str, ir.RouteIR | None]:
        """Each named route's IR as `ir.build` and placement give it (None: removed)."""
        backends: dict[str, tuple[ir.Backend, str] | str] = {}
        new: dict[str, ir.RouteIR | None] = {}
        for route_id in named:
            message = state.get("routes", route_id)
            if message is None:
                new[route_id] = None
                continue
            if state.get("tombstones", route_id) is not None:
                raise invalid(f"route {route_id}: both present and tombstoned")
            key = message.SerializeToString(deterministic=True)  # type: ignore[union-attr]
            route = resolved.get(key) or ir.route_ir(message, backends)  # type: ignore[arg-type]
            resolved[key] = route
            new[route_id] = placement.placed_route(route, self.verifiable, self.trust, self.options)
        return new

    def _same_site(self, old: dict[str, ir.RouteIR], new: dict[str, ir.RouteIR | None]) -> bool:
        """Whether the change leaves alone everything the listener and the site-wide resources are
        rendered from (tenants, placements, verified tenants, keying, MCP routes)."""
        counts: dict[tuple[str, str], int] = {}

        def count(route: ir.RouteIR, sign: int) -> None:
            for fact in (
                ("tenant", route.tenant_id),
                ("placement", route.placement),
                *((("verified", route.tenant_id),) if _verified(route) else ()),
            ):
                counts[fact] = counts.get(fact, 0) + sign

        envoy_verified = self.envoy_verified
        unkeyed = set(self.unkeyed)
        for route in old.values():
            if route.kind == ir.MCP_KIND or route.policies:
                return False
            count(route, -1)
            envoy_verified -= _verified(route) and route.placement == placement.ENVOY
            unkeyed.discard(route.route_id)
        for route in new.values():
            if route is None:
                continue
            if route.kind == ir.MCP_KIND or route.policies:
                return False
            count(route, +1)
            envoy_verified += _verified(route) and route.placement == placement.ENVOY
            if scope_key(route.path_prefix) is None:
                unkeyed.add(route.route_id)
        held = {"tenant": self.tenants, "placement": self.placements, "verified": self.verified_tenants}
        for (what, name), change in counts.items():
            if change and (held[what][name] > 0) != (held[what][name] + change > 0):
                return False
        if (envoy_verified > 0) != (self.envoy_verified > 0):
            return False
        keyed = self.options.route_scopes and not unkeyed
        return keyed == self.by_scope and bool(unkeyed) == bool(self.unkeyed)

    def _check_prefixes(self, old: dict[str, ir.RouteIR], new: dict[str, ir.RouteIR | None]) -> None:
        """Two routes with one path prefix are refused, naming the first two by route id (as
        `ir.build`, which meets them in that order)."""
        leaving = set(old)
        by_prefix: dict[str, list[str]] = {}
        for route in new.values():
            if route is not None:
                by_prefix.setdefault(route.path_prefix, []).append(route.route_id)
        clashes = []
        for prefix, ids in by_prefix.items():
            holder = self.prefixes.get(prefix)
            owners = sorted({*ids, *([holder] if holder is not None and holder not in leaving else [])})
            if len(owners) > 1:
                clashes.append((owners[1], owners[0], prefix))
        if clashes:
            second, first, prefix = min(clashes)
            raise invalid(f"routes {first} and {second}: same path prefix {prefix}")

    def _remove_entry(self, route_id: str) -> None:
        bucket = route_bucket(route_id)
        del self.entries[bucket][route_id]
        if not self.entries[bucket]:
            del self.entries[bucket]

    def _add_entry(self, route: ir.RouteIR) -> None:
        self.entries.setdefault(route_bucket(route.route_id), {})[route.route_id] = route_entry(route)

    def _snapshot(
        self,
        generation: int,
        touched: set[str],
        keys_gone: set[str],
        keys_new: set[str],
        backends_before: set[str],
        buckets_changed: set[str],
    ) -> Snapshot:
        previous = self.previous
        for name in touched:
            rows = self.rows.get(name, {})
            if not rows and name not in self.well_known and self.by_scope:
                self.tables.pop(name, None)
                self.rows.pop(name, None)
                continue
            parts = tuple(body for _, body in sorted(rows.values()))
            version = self.proc_version if (not self.by_scope or name in self.uses_processing) else None
            self.tables[name] = route_table(
                name, parts, version, self.well_known.get(name, []), self.by_scope
            )
        edits: dict[str, tuple[list[Message], list[Message]]] = {}
        if self.by_scope and (keys_gone or keys_new):
            gone, added = [], []
            for key in keys_gone:
                at = bisect.bisect_left(self.key_list, key)
                gone.append(self.scope_list[at])
                del self.key_list[at], self.scope_list[at]
            for key in keys_new:
                at = bisect.bisect_left(self.key_list, key)
                self.key_list.insert(at, key)
                added.append(scope(key))
                self.scope_list.insert(at, added[-1])
            scopes: tuple[Message, ...] = tuple(self.scope_list)
            edits[SCOPED_ROUTE] = (gone, added)
        else:
            scopes = previous.of(SCOPED_ROUTE)
        clusters: Iterable[Message] = previous.of(CLUSTER)
        if set(self.backends) != backends_before:
            for name in backends_before - self.backends.keys():
                del self.backend_of[name]
            # The services' clusters as they were (the routes' site-wide facts are unchanged).
            services = [c for c in clusters if c.name not in backends_before]  # type: ignore[attr-defined]
            clusters = [*backend_clusters(self.backend_of), *services]
        # The policy sets carry no generation: unchanged content is the same object, served as it was;
        # of the authorization set, only the buckets of the routes whose entries changed are rebuilt.
        authz: tuple[Message, ...] = previous.of(AUTHZ_POLICY_SET)
        if buckets_changed:
            for name in buckets_changed:
                rows = self.entries.get(name)
                if rows is None:
                    self.buckets.pop(name, None)
                    continue
                rebuilt = render_bucket(name, [rows[i] for i in sorted(rows)], self.site)
                if rebuilt.version != getattr(self.buckets.get(name), "version", None):
                    self.buckets[name] = rebuilt
            authz = (authz[0], *(self.buckets[n] for n in sorted(self.buckets)))
        resources: dict[str, Iterable[Message]] = {
            **previous.resources,
            CLUSTER: clusters,
            ROUTE: tuple(self.tables[n] for n in sorted(self.tables)),
            AUTHZ_POLICY_SET: authz,
        }
        if self.by_scope:
            resources[SCOPED_ROUTE] = scopes
        ordered = (CLUSTER, ROUTE, SCOPED_ROUTE, AUTHZ_POLICY_SET, PROC_POLICY_SET, MCP_POLICY_SET)
        snapshot = Snapshot.build(self.site.gateway_id, generation, resources, previous, ordered, edits)
        self.previous = snapshot
        return snapshot


def _entries(routes: Iterable[ir.RouteIR]) -> dict[str, dict[str, bytes]]:
    entries: dict[str, dict[str, bytes]] = {}
    for route in routes:
        entries.setdefault(route_bucket(route.route_id), {})[route.route_id] = route_entry(route)
    return entries


def _decrement(counter: Counter[str], key: str) -> None:
    counter[key] -= 1
    if counter[key] <= 0:
        del counter[key]
