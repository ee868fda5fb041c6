"""The authorization policy set: what the authorization service needs to decide for each route, served
as several resources of the type AuthzPolicySet. `default` holds what is site-wide (trusted issuers,
consumers, subscriptions, revocations); `routes-NNN` hold the routes, each route in the bucket of its
id (a stable hash, `POLICY_BUCKETS` of them), so a new or edited route changes one bucket of a few
dozen routes, not a 10,000-route resource: the Link renders, and the service compiles, that bucket
alone. A state-of-the-world response carries all of them and a delta one those that changed; either way
the service takes the complete set as one.

Each resource's `version` hashes its content only, and none carries a generation: a generation that
changes nothing the service decides on keeps every resource byte for byte. The set's version
(`set_version`) is the hash of its resources' names and versions.

Each Envoy route decided by the service names, as the context extension `route_version`, the version
of its own entry in the set (`route_version`), not the set's: the service decides a Check with the
newest set it holds that has the route as Envoy's entry was built with. So a route decided with set N
while N+1 rolls out (or after N+1 is refused) still gets N's rules, and a change elsewhere in the set
(another route, a consumer, a key) leaves every other route's Envoy entries untouched.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from typing import TypeVar

from stoa_proto import authz_pb2, inventory_pb2, mcp_pb2, proc_pb2

from stoa_translate.decision import placement
from stoa_translate.ir import MCP_KIND, RouteIR, SiteIR
from stoa_translate.policies import PROCESSING_KINDS

POLICY_SET_NAME = "default"
# The authorization set's route buckets: a route's change re-sends and recompiles its bucket (about
# routes ÷ this many entries; 160 at 10,000 routes). Every resource costs both sides a little on every
# push (packing, unpacking): measured at 10,000 and at 100 routes, 64 buckets beat 256.
POLICY_BUCKETS = 64
ROUTES_RESOURCE_PREFIX = "routes-"
PolicySetT = TypeVar("PolicySetT", authz_pb2.AuthzPolicySet, proc_pb2.ProcPolicySet)


def route_version(entry: authz_pb2.AuthzRoute) -> str:
    """The version of one route's entry: the hash of its deterministic serialisation. The translator
    puts it on the route's Envoy entries, the authorization service computes it from the entry it
    loaded: equal content, equal version, on both sides."""
    return hashlib.sha256(entry.SerializeToString(deterministic=True)).hexdigest()[:16]


@functools.lru_cache(maxsize=65_536)
def _authz_route(r: RouteIR) -> authz_pb2.AuthzRoute:
    return authz_pb2.AuthzRoute(
        route_id=r.route_id,
        tenant_id=r.tenant_id,
        api_id=r.api_id,
        auth_mode=r.auth_mode,
        scopes=r.scopes,
        verified_by_envoy=r.placement == placement.SERVICE_VERIFIED_TOKEN,
        envelope=r.envelope,
        key_header=r.key_header,
        subscription=r.subscription,
        opa=r.policy("opa").message() if r.policy("opa") else None,
    )


@functools.lru_cache(maxsize=65_536)
def route_version_of(r: RouteIR) -> str:
    """`route_version` of the entry `r` gets in the set (what its Envoy entries pass to the Check)."""
    return route_version(_authz_route(r))


@functools.lru_cache(maxsize=65_536)
def route_entry(r: RouteIR) -> bytes:
    """One route of the set, serialised as a set holding only it: serialised messages concatenate
    into their merge (repeated fields appended in order), so a bucket's entries are parsed once from
    their joined bytes and only a changed route is built again (routes are value objects)."""
    return authz_pb2.AuthzPolicySet(routes=[_authz_route(r)]).SerializeToString()


@functools.lru_cache(maxsize=65_536)
def route_bucket(route_id: str) -> str:
    """The name of the resource holding `route_id`'s entry (the same on every Link, in every process)."""
    bucket = int.from_bytes(hashlib.sha256(route_id.encode()).digest()[:4], "big") % POLICY_BUCKETS
    return f"{ROUTES_RESOURCE_PREFIX}{bucket:03d}"


def render_policy_set(site: SiteIR) -> tuple[authz_pb2.AuthzPolicySet, ...]:
    """The set's resources, in name order: `default`, then each bucket that holds a route."""
    buckets: dict[str, list[bytes]] = {}
    for r in site.routes:
        buckets.setdefault(route_bucket(r.route_id), []).append(route_entry(r))
    return (render_site_resource(site), *(render_bucket(n, buckets[n], site) for n in sorted(buckets)))


def render_site_resource(site: SiteIR) -> authz_pb2.AuthzPolicySet:
    """`default`: the site-wide part of the set."""
    content = authz_pb2.AuthzPolicySet(
        issuers=[
            inventory_pb2.TrustedIssuer(
                tenant_id=i.tenant_id, issuer=i.issuer, jwks_json=i.jwks_json, jwks_uri=i.jwks_uri
            )
            for i in site.issuers
        ],
        consumers=site.consumers,
        subscriptions=site.subscriptions,
        revoked_key_sha256=site.revoked_key_sha256,
    )
    return _stamped(content, site)


def render_bucket(name: str, entries: Iterable[bytes], site: SiteIR) -> authz_pb2.AuthzPolicySet:
    """The bucket `name` from its routes' `route_entry` bytes, in route order (joined, parsed once)."""
    return _stamped(authz_pb2.AuthzPolicySet.FromString(b"".join(entries)), site, name)


def set_version(resources: Iterable[authz_pb2.AuthzPolicySet]) -> str:
    """The version of the set made of `resources`: the hash of their names and versions (the one
    resource's own version when there is one only). The service computes it from what it received."""
    held = sorted((r.name, r.version) for r in resources)
    if len(held) == 1:
        return held[0][1]
    return hashlib.sha256("".join(f"{n}\n{v}\n" for n, v in held).encode()).hexdigest()[:16]


def merged(resources: Iterable[authz_pb2.AuthzPolicySet]) -> authz_pb2.AuthzPolicySet:
    """The set's resources as the one set the service takes them for: every route and the site-wide
    lists in one message, named `default`, versioned `set_version`."""
    held = list(resources)
    whole = authz_pb2.AuthzPolicySet()
    for resource in held:
        whole.MergeFrom(resource)
    whole.name, whole.version = POLICY_SET_NAME, set_version(held)
    return whole


def render_proc_policy_set(site: SiteIR) -> proc_pb2.ProcPolicySet:
    """The ProcPolicySet `default`: each route with a body policy and its rules. Versioned like the
    authorization set (content only), and carried to the service in each stream's metadata."""
    content = proc_pb2.ProcPolicySet()
    for route in site.routes:
        if not route.policies:
            continue
        rules = {name: route.policy(name) for name in PROCESSING_KINDS}
        if not any(rules.values()):
            continue
        entry = content.routes.add(route_id=route.route_id, tenant_id=route.tenant_id, api_id=route.api_id)
        for name, ir in rules.items():
            if ir is not None:
                # The member of ProcRoute named like the kind holds its rules.
                getattr(entry, name).CopyFrom(ir.message())
    return _stamped(content, site)


def _stamped(content: PolicySetT, site: SiteIR, name: str = "") -> PolicySetT:
    """`content` versioned by its content alone, then named and told its gateway."""
    content.version = hashlib.sha256(content.SerializeToString(deterministic=True)).hexdigest()[:16]
    content.name = name or POLICY_SET_NAME
    content.gateway_id = site.gateway_id
    return content


def render_mcp_policy_set(site: SiteIR) -> mcp_pb2.McpPolicySet:
    """The McpPolicySet `default`: the MCP routes and the tools of their tenants (versioned by content)."""
    content = mcp_pb2.McpPolicySet(
        routes=[
            mcp_pb2.McpRoute(
                route_id=r.route_id, tenant_id=r.tenant_id, api_id=r.api_id, path_prefix=r.path_prefix
            )
            for r in site.routes
            if r.kind == MCP_KIND
        ],
        tools=site.tools,
    )
    version = hashlib.sha256(content.SerializeToString(deterministic=True)).hexdigest()[:16]
    content.name = POLICY_SET_NAME
    content.version = version
    content.gateway_id = site.gateway_id
    return content
