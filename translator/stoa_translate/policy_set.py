"""The AuthzPolicySet `default`: what the authorization service needs to decide for each route.

Its `version` hashes its content only (routes, issuers, consumers, subscriptions, revocations), and
it carries no generation: a generation that changes nothing the service decides on keeps the same
set, byte for byte, so a change of routes alone (at 10,000 routes, a 600 KB set) costs it nothing.

Each Envoy route decided by the service names, as the context extension `route_version`, the version
of its own entry in the set (`route_version`), not the set's: the service decides a Check with the
newest set it holds that has the route as Envoy's entry was built with. So a route decided with set N
while N+1 rolls out (or after N+1 is refused) still gets N's rules, and a change elsewhere in the set
(another route, a consumer, a key) leaves every other route's Envoy entries untouched.
"""

from __future__ import annotations

import functools
import hashlib
from typing import TypeVar

from stoa_proto import authz_pb2, inventory_pb2, mcp_pb2, proc_pb2

from stoa_translate.decision import placement
from stoa_translate.ir import MCP_KIND, RouteIR, SiteIR
from stoa_translate.policies import PROCESSING_KINDS

POLICY_SET_NAME = "default"
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
    into their merge (repeated fields appended in order), so 10,000 entries are parsed once from
    their joined bytes and only a changed route is built again (routes are value objects)."""
    return authz_pb2.AuthzPolicySet(routes=[_authz_route(r)]).SerializeToString()


def render_policy_set(site: SiteIR, entries: bytes | None = None) -> authz_pb2.AuthzPolicySet:
    """`entries`: the routes' `route_entry` bytes joined in route order, when the caller keeps them
    (a change of one route among 10,000 then joins them instead of looking each up)."""
    if entries is None:
        entries = b"".join(route_entry(r) for r in site.routes)
    content = authz_pb2.AuthzPolicySet.FromString(entries)
    content.issuers.extend(
        [
            inventory_pb2.TrustedIssuer(
                tenant_id=i.tenant_id, issuer=i.issuer, jwks_json=i.jwks_json, jwks_uri=i.jwks_uri
            )
            for i in site.issuers
        ]
    )
    content.consumers.extend(site.consumers)
    content.subscriptions.extend(site.subscriptions)
    content.revoked_key_sha256.extend(site.revoked_key_sha256)
    return _stamped(content, site)


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


def _stamped(content: PolicySetT, site: SiteIR) -> PolicySetT:
    """`content` named and versioned by its content alone, then told its gateway."""
    content.version = hashlib.sha256(content.SerializeToString(deterministic=True)).hexdigest()[:16]
    content.name = POLICY_SET_NAME
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
