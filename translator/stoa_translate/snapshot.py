"""A snapshot: everything the Link serves over ADS for one inventory generation.

The translator produces it (pure), the ADS server serves it. Its version is a hash of the
deterministic serialisation of its content, so the same content always has the same version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from google.protobuf.message import Message

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


def content_version(
    resources: Mapping[str, Iterable[Message]], bodies: Mapping[int, bytes] | None = None
) -> str:
    """Hash of the deterministic serialisation of every resource, by type then by name (`bodies`: the
    serialisations already made, by object identity)."""
    digest = hashlib.sha256()
    for type_url in sorted(resources):
        digest.update(type_url.encode())
        for res in sorted(resources[type_url], key=resource_name):
            body = bodies.get(id(res)) if bodies else None
            if body is None:
                body = res.SerializeToString(deterministic=True)
            digest.update(len(body).to_bytes(8, "big"))
            digest.update(body)
    return digest.hexdigest()[:16]


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

    @classmethod
    def build(
        cls,
        gateway_id: str,
        generation: int,
        resources: Mapping[str, Iterable[Message]],
        previous: Snapshot | None = None,
    ) -> Snapshot:
        """`previous`: a snapshot whose resource objects, where this one holds the same object again,
        were not changed since (the translator's kept tables and scopes): their bytes are reused, so
        a change costs the serialisation of what changed, not of 10,000 routes."""
        ordered = {t: tuple(sorted(rs, key=resource_name)) for t, rs in resources.items()}
        known = previous.bodies if previous is not None else {}
        bodies: dict[int, bytes] = {}
        for held in ordered.values():
            for res in held:
                body = known.get(id(res))
                bodies[id(res)] = res.SerializeToString(deterministic=True) if body is None else body
        return cls(gateway_id, generation, ordered, content_version(ordered, bodies), bodies)

    def of(self, type_url: str) -> tuple[Message, ...]:
        return self.resources.get(type_url, ())

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
            if manager.HasField("scoped_routes") and not snapshot.of(SCOPED_ROUTE) and routes:
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
