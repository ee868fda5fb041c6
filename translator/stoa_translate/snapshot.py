"""A snapshot: everything the Link serves over ADS for one inventory generation.

The translator produces it (pure), the ADS server serves it. Its version is a hash of the
deterministic serialisation of its content, so the same content always has the same version.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from google.protobuf.message import Message
from stoa_proto.inventory_delta import MODULUS, tagged_digest

from stoa_translate.routes import ROUTE_CONFIG_NAME as ONE_TABLE

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
SCOPED_ROUTE = "type.googleapis.com/envoy.config.route.v3.ScopedRouteConfiguration"
AUTHZ_POLICY_SET = "type.googleapis.com/stoa.authz.v1.AuthzPolicySet"
PROC_POLICY_SET = "type.googleapis.com/stoa.proc.v1.ProcPolicySet"
MCP_POLICY_SET = "type.googleapis.com/stoa.mcp.v1.McpPolicySet"
# Relayed by the Link as the CP signed it, outside every snapshot (never rolled back with Envoy's).
TOOL_PERMISSIONS = "type.googleapis.com/stoa.mcp.v1.ToolPermissions"

# Envoy's own types, in the order a state-of-the-world publication must follow (scoped routes only
# where the listener asks for them, over delta xDS).
ENVOY_TYPES: tuple[str, ...] = (CLUSTER, LISTENER, SCOPED_ROUTE, ROUTE)
# Types served to the site services; published (and acknowledged) before Envoy's.
SITE_SERVICE_TYPES: tuple[str, ...] = (AUTHZ_POLICY_SET, PROC_POLICY_SET, MCP_POLICY_SET)


def resource_name(resource: Message) -> str:
    return str(resource.name)  # type: ignore[attr-defined]


def resource_digest(type_url: str, body: bytes) -> int:
    """One resource's share of the version, from its type and deterministic serialisation (its name
    is part of it)."""
    return tagged_digest(type_url, body)


def _version(total: int) -> str:
    """The snapshot version from the sum of its resources' digests: order-free and additive (like the
    inventory's hash), so a snapshot that changes a few of 10,000 resources updates it for those."""
    return hashlib.sha256((total % MODULUS).to_bytes(32, "big")).hexdigest()[:16]


@dataclass(frozen=True)
class _Kept:
    """One type's resources as serialised: body and digest by object identity (only of the objects
    the type holds, so an identity is never that of a freed object), and the digests' sum."""

    bodies: dict[int, bytes]
    digests: dict[int, int]
    total: int
    # Set when a later snapshot took these maps over (`edited`): they then describe that one.
    moved: list[bool] = field(default_factory=lambda: [False])

    @classmethod
    def of(cls, type_url: str, resources: tuple[Message, ...], before: _Kept | None) -> _Kept:
        if before is None or not before.bodies:
            bodies = {id(r): r.SerializeToString(deterministic=True) for r in resources}
            digests = {key: resource_digest(type_url, body) for key, body in bodies.items()}
            return cls(bodies, digests, sum(digests.values()))
        # Set operations on identities (C speed): only what came and went is looked at in Python.
        now = set(map(id, resources))
        gone, added = before.bodies.keys() - now, now - before.bodies.keys()
        if not gone and not added:
            return before
        bodies, digests, total = dict(before.bodies), dict(before.digests), before.total
        for key in gone:
            del bodies[key]
            total -= digests.pop(key)
        for res in resources if added else ():
            if id(res) in added:
                body = res.SerializeToString(deterministic=True)
                bodies[id(res)], digests[id(res)] = body, resource_digest(type_url, body)
                total += digests[id(res)]
        return cls(bodies, digests, total)

    @classmethod
    def edited(cls, type_url: str, before: _Kept, gone: Iterable[Message], added: Iterable[Message]) -> _Kept:
        """`before` less `gone` plus `added`, its maps taken over (not copied: 10,000 scopes), so
        `before` is marked moved and a build from it again recomputes."""
        if before.moved[0]:
            raise ValueError("edited twice")
        before.moved[0] = True
        bodies, digests, total = before.bodies, before.digests, before.total
        for res in gone:
            del bodies[id(res)]
            total -= digests.pop(id(res))
        for res in added:
            body = res.SerializeToString(deterministic=True)
            bodies[id(res)], digests[id(res)] = body, resource_digest(type_url, body)
            total += digests[id(res)]
        return cls(bodies, digests, total)


class _Bodies(Mapping[int, bytes]):
    """Every resource's deterministic serialisation by object identity, over the types' own maps."""

    def __init__(self, kept: Mapping[str, _Kept]) -> None:
        self._maps = [k.bodies for k in kept.values()]

    def __getitem__(self, key: int) -> bytes:
        for bodies in self._maps:
            body = bodies.get(key)
            if body is not None:
                return body
        raise KeyError(key)

    def __iter__(self) -> Iterator[int]:
        for bodies in self._maps:
            yield from bodies

    def __len__(self) -> int:
        return sum(len(bodies) for bodies in self._maps)


@dataclass(frozen=True)
class Snapshot:
    """Resources by type URL, each tuple sorted by resource name."""

    gateway_id: str
    generation: int
    resources: Mapping[str, tuple[Message, ...]]
    version: str = field(default="")
    # Each resource's deterministic serialisation, by the identity of the object `resources` holds:
    # the ADS server packs these bytes, and a next build given this snapshot reuses them.
    bodies: Mapping[int, bytes] = field(default_factory=dict, compare=False, repr=False)
    _kept: Mapping[str, _Kept] = field(default_factory=dict, compare=False, repr=False)
    # Per type built from `edits`: (the previous snapshot's resources of the type, what left them,
    # what joined them), so a server can follow the change instead of comparing 10,000 resources.
    edits: Mapping[str, tuple[tuple[Message, ...], tuple[Message, ...], tuple[Message, ...]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    @classmethod
    def build(
        cls,
        gateway_id: str,
        generation: int,
        resources: Mapping[str, Iterable[Message]],
        previous: Snapshot | None = None,
        ordered: Iterable[str] = (),
        edits: Mapping[str, tuple[Iterable[Message], Iterable[Message]]] | None = None,
    ) -> Snapshot:
        """`previous`: a snapshot whose resource objects, where this one holds the same object again,
        were not changed since (the translator's kept tables and scopes): their bytes and digests are
        reused, and only the objects not held before are serialised, so a change costs what changed,
        not 10,000 routes. `ordered`: the types whose resources are given as a tuple already in name
        order. `edits`: for a type, what left `previous`'s resources of that type and what joined
        them to give the ones here (each object once), so not even the others are looked at."""
        presorted = frozenset(ordered)
        held: dict[str, tuple[Message, ...]] = {}
        kept: dict[str, _Kept] = {}
        followed: dict[str, tuple[tuple[Message, ...], tuple[Message, ...], tuple[Message, ...]]] = {}
        for type_url, given in resources.items():
            if type_url in presorted and isinstance(given, tuple):
                in_order = given
            else:
                in_order = tuple(sorted(given, key=resource_name))
            held[type_url] = in_order
            before = previous._kept.get(type_url) if previous is not None else None
            if edits and type_url in edits and before is not None and not before.moved[0]:
                gone, added = (tuple(e) for e in edits[type_url])
                kept[type_url] = _Kept.edited(type_url, before, gone, added)
                followed[type_url] = (previous.of(type_url), gone, added)  # type: ignore[union-attr]
            elif before is not None and before.moved[0]:
                kept[type_url] = _Kept.of(type_url, in_order, None)
            else:
                kept[type_url] = _Kept.of(type_url, in_order, before)
        version = _version(sum(k.total for k in kept.values()))
        return cls(gateway_id, generation, held, version, _Bodies(kept), kept, followed)

    def of(self, type_url: str) -> tuple[Message, ...]:
        return self.resources.get(type_url, ())

    @functools.cached_property
    def on_request(self) -> frozenset[str]:
        """The route tables served for older listeners only: the one table, closed, while no listener
        names it (the routes go by scope). Envoy holds it only while such a listener asks for it."""
        if ONE_TABLE not in self.names(ROUTE):
            return frozenset()
        named = {m.rds.route_config_name for listener in self.of(LISTENER) for m in _managers(listener)}
        return frozenset() if ONE_TABLE in named else frozenset({ONE_TABLE})

    def names(self, type_url: str) -> list[str]:
        return [resource_name(r) for r in self.of(type_url)]


def dangling_references(snapshot: Snapshot, route_clusters: Iterable[str] | None = None) -> list[str]:
    """What a resource of `snapshot` names that the snapshot does not hold, one line each; [] when
    consistent. Checked before anything is served, because Envoy accepts a route to a missing cluster
    and answers 503: every route configuration a listener names over RDS, every cluster a route entry
    or an HTTP filter names, every route configuration a scope names. Extra clusters are fine
    (make-before-break serves old and new ones).

    `route_clusters`, when given, are the clusters the route configurations name, already collected
    (the translator keeps them per rendered route, so a large table is not walked again)."""
    routes = set(snapshot.names(ROUTE))
    clusters = set(snapshot.names(CLUSTER))
    missing: list[str] = []
    for listener in snapshot.of(LISTENER):
        for manager in _managers(listener):
            rds = manager.rds.route_config_name if manager.HasField("rds") else None
            if rds is not None and rds not in routes:
                missing.append(f"listener {resource_name(listener)}: route configuration {rds} is missing")
            # The one table's name stays served (closed) while the routes go by scope.
            if (
                manager.HasField("scoped_routes")
                and not snapshot.of(SCOPED_ROUTE)
                and routes - snapshot.on_request
            ):
                missing.append(f"listener {resource_name(listener)}: routes by scope, but no scope")
            for http_filter in manager.http_filters:
                name = _grpc_cluster(http_filter)
                if name and name not in clusters:
                    missing.append(
                        f"listener {resource_name(listener)}: filter {http_filter.name} names missing "
                        f"cluster {name}"
                    )
    if route_clusters is None:
        named: set[str] = set()
        for config in snapshot.of(ROUTE):
            for host in config.virtual_hosts:  # type: ignore[attr-defined]
                named.update(clusters_named(host.routes))
    else:
        named = set(route_clusters)
    for scope in snapshot.of(SCOPED_ROUTE):
        table = scope.route_configuration_name  # type: ignore[attr-defined]
        if table not in routes:
            missing.append(f"scope {resource_name(scope)}: route configuration {table} is missing")
    missing.extend(f"a route names missing cluster {name}" for name in sorted(named - clusters))
    return missing


def clusters_named(entries: Iterable[Message]) -> set[str]:
    """The clusters route entries forward to."""
    named = set()
    for entry in entries:
        action = entry.route  # type: ignore[attr-defined]
        if action.cluster:
            named.add(action.cluster)
        named.update(w.name for w in action.weighted_clusters.clusters)
    return named


def _managers(listener: Message) -> list[hcm.HttpConnectionManager]:
    managers = []
    for chain in listener.filter_chains:  # type: ignore[attr-defined]
        for network_filter in chain.filters:
            if network_filter.typed_config.Is(hcm.HttpConnectionManager.DESCRIPTOR):
                manager = hcm.HttpConnectionManager()
                network_filter.typed_config.Unpack(manager)
                managers.append(manager)
    return managers


def _grpc_cluster(http_filter: hcm.HttpFilter) -> str:
    if not http_filter.typed_config.Is(ext_authz_pb2.ExtAuthz.DESCRIPTOR):
        return ""
    config = ext_authz_pb2.ExtAuthz()
    http_filter.typed_config.Unpack(config)
    return str(config.grpc_service.envoy_grpc.cluster_name)
