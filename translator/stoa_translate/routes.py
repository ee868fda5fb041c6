"""The route configuration `stoa-routes`: one virtual host, one entry per route and allowed method.

Matching: `path_separated_prefix`, so `/apis/a` matches `/apis/a` and `/apis/a/...` but never
`/apis/ab`. Entries are ordered longest prefix first (then route id, then method), so a nested
prefix wins over its parent whatever the route ids are.

Rewrite: the matched path_prefix is replaced by the upstream URL's base path —
`/apis/x/foo` → `/base/foo` and `/apis/x` → `/base` for `http://h/base`; `/apis/x/foo` → `/foo` and
`/apis/x` → `/` for an upstream without a path. The query string is kept.

Refusal: the first entries answer 400 to a path `stoa_proto.paths` refuses (a hidden dot segment, a
foreign escape; the rules the authorization service also applies), before any route can match it and
without a Check.

Closed: while the routes go by scope, the one table's name is still served, with one entry that
answers 503 (Retry-After) to every request. A listener built before the switch to scopes keeps the
connections it accepted until it has drained, and reads that name over RDS: without it Envoy would
keep the table as it last was, so those connections would keep the routes and policies of then (a
route removed since answering, a policy added since missing). The other way, the scopes an older
listener reads are removed with the switch, and Envoy answers 404 on its connections.

Credential: a route that checks a token removes the client's `authorization` before the upstream
(the router applies it after ext_authz, which has read it), an api_key route its key header, unless
the API forwards it.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from envoy.config.core.v3 import base_pb2
from envoy.config.route.v3 import route_components_pb2, route_pb2, scoped_route_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from google.protobuf import any_pb2, duration_pb2, message
from stoa_proto.bodies import CONTENT_TYPE, DENY_BODIES
from stoa_proto.decisions import API_HEADER, TENANT_HEADER
from stoa_proto.paths import FOREIGN_ESCAPE, HIDDEN_DOT_SEGMENT

from stoa_translate import mcp
from stoa_translate.decision import claims, jwt_authn, placement
from stoa_translate.filters import (
    BUFFER_FILTER,
    CLAIMS_RBAC_FILTER,
    EXT_AUTHZ_DISABLED,
    EXT_AUTHZ_FILTER,
    JWT_AUTHN_FILTER,
    PROCESSED_BUFFER_FILTER,
    REQUEST_RBAC_FILTER,
    buffer_route,
    ext_authz_route,
    merge_ext_proc_routes,
    packed,
    virtual_host_configs,
)
from stoa_translate.ir import MCP_KIND, RouteIR, SiteIR
from stoa_translate.options import TranslateOptions
from stoa_translate.policies import KINDS
from stoa_translate.policy_set import route_version_of

ROUTE_CONFIG_NAME = "stoa-routes"
# Scoped RDS: Envoy keys a request by the second segment of its normalised path without the query
# string (a `:path` key would take `orders?x=1` from `/apis/orders?x=1`), which the listener's early
# header mutation writes into this header (over any value the client sent); the tables remove it
# before the upstream.
SCOPE_KEY_HEADER = "x-stoa-route-key"
ROUTE_SCOPES_NAME = "stoa-scopes"
SCOPE_NAME_PREFIX = "stoa-scope:"
# Route tables per gateway under Scoped RDS: a change re-sends the one table of its key's bucket (about
# routes ÷ this many routes), and a cold load builds this many tables, not one per API. At 10,000 routes
# (bench/PROFILE-publication.md, round 4) 256 rather than 128 halved Envoy's ACK of a change's table
# with a cold load no slower and Envoy's memory 1.29 times one table's; 512 took that to 1.40 times and
# the cold load 20 % slower.
ROUTE_TABLE_BUCKETS = 256
VIRTUAL_HOST_NAME = "stoa"
# Clients must not be able to pass an "original path" of their choosing to an upstream.
CLIENT_HEADERS_REMOVED = ("x-envoy-original-path",)
HIDDEN_DOT_SEGMENT_ROUTE = "stoa-refuse-hidden-dot-segment"
# The path refusals (every rule of `stoa_proto.paths.REFUSED_PATHS`), first in the virtual host: one
# entry per rule, each its own RE2 program under Envoy's size limit.
REFUSAL_ROUTES: tuple[tuple[str, str], ...] = (
    (HIDDEN_DOT_SEGMENT_ROUTE, HIDDEN_DOT_SEGMENT),
    ("stoa-refuse-foreign-escape", FOREIGN_ESCAPE),
)
CREDENTIAL_HEADER = "authorization"


# Route → its entries, serialised as a VirtualHost holding only them, for one set of options.
# Serialised messages concatenate into one message with the repeated field appended in order, so the
# virtual host is parsed once from the joined bytes instead of being rebuilt entry by entry: with
# 10,000 routes and one changed (or added), one route is rendered again. The entries depend on their
# own route only (a Check names the version of its route's policy-set entry, not the set's), so a new
# set costs nothing here.
RenderedRoutes = Mapping[RouteIR, bytes]


@dataclass(frozen=True)
class RouteTables:
    """The route configurations of a translation, and the scopes that select them (Scoped RDS)."""

    tables: list[route_pb2.RouteConfiguration]
    # Empty: one route table, named by the listener (`stoa-routes`).
    scopes: list[scoped_route_pb2.ScopedRouteConfiguration] = field(default_factory=list)
    # Scoped RDS was asked for, but these routes' prefixes cannot be keyed: one table instead.
    unkeyed: tuple[str, ...] = ()


# A table's name → (the rendered bodies it was assembled from, the processing set's version it names,
# the table), so an unchanged table is the same object in the next translation.
KeptTable = tuple[tuple[bytes, ...], str | None, route_pb2.RouteConfiguration]
KeptTables = Mapping[str, KeptTable]


@functools.lru_cache(maxsize=65_536)
def scope_key(path: str) -> str | None:
    """The scope key of a path prefix: its second segment (`orders` of `/apis/orders` and of
    `/apis/orders/v2`), what Envoy extracts from a request's normalised path. None when the prefix
    has fewer than two segments: the requests it matches have no one key."""
    parts = path.split("/", 3)
    return parts[2] if len(parts) > 2 and parts[2] else None


@functools.lru_cache(maxsize=65_536)
def table_name(key: str) -> str:
    """The bucketed route table holding the routes of scope `key` (a stable hash: every process, every
    translation puts a key in the same table)."""
    bucket = int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") % ROUTE_TABLE_BUCKETS
    return f"{ROUTE_CONFIG_NAME}-{bucket:03d}"


def unkeyed_routes(site: SiteIR) -> tuple[str, ...]:
    """The routes whose prefix gives no scope key (they keep the gateway on one route table)."""
    return tuple(sorted(r.route_id for r in site.routes if scope_key(r.path_prefix) is None))


def scoped(site: SiteIR, options: TranslateOptions) -> bool:
    """Whether this translation routes through scopes (the listener's choice and the tables')."""
    return options.route_scopes and not unkeyed_routes(site)


def render_routes(
    site: SiteIR,
    options: TranslateOptions,
    proc_version: str | None,
    previous: RenderedRoutes,
    kept: KeptTables | None = None,
) -> tuple[RouteTables, dict[RouteIR, bytes], dict[str, KeptTable]]:
    """The route tables (and scopes), each route's rendered entries for the next call's `previous`
    (which must have been rendered with the same options), and the tables for the next call's `kept`."""
    by_scope = scoped(site, options)
    rendered: dict[RouteIR, bytes] = {}
    bodies: dict[str, list[bytes]] = {}
    uses_processing: set[str] = set()
    for route in sorted(site.routes, key=lambda r: (-len(r.path_prefix), r.route_id)):
        body = previous.get(route)
        if body is None:
            entries = route_entries(route, options)
            body = route_components_pb2.VirtualHost(routes=entries).SerializeToString()
        rendered[route] = body
        name = table_name(scope_key(route.path_prefix) or "") if by_scope else ROUTE_CONFIG_NAME
        bodies.setdefault(name, []).append(body)
        if route.uses_processing():
            uses_processing.add(name)
    well_known: dict[str, list[route_components_pb2.Route]] = {}
    keys = {scope_key(r.path_prefix) or "" for r in site.routes}
    for entry in mcp.well_known_entries(site):
        key = scope_key(entry.match.path) or ""
        keys.add(key)
        name = table_name(key) if by_scope else ROUTE_CONFIG_NAME
        well_known.setdefault(name, []).append(entry)
        bodies.setdefault(name, [])
    if not by_scope:
        bodies.setdefault(ROUTE_CONFIG_NAME, [])
    tables = [closed_table()] if by_scope else []
    now: dict[str, KeptTable] = {}
    for name in sorted(bodies):
        parts = tuple(bodies[name])
        # One table: the processing set's version whenever the site uses it (as before scopes); per
        # scope table, only where one of its routes does, so a processing change touches those only.
        version = proc_version if (not by_scope or name in uses_processing) else None
        before = (kept or {}).get(name)
        same = before is not None and before[:2] == (parts, version)
        if before is not None and same and name not in well_known:
            table = before[2]
        else:
            table = route_table(name, parts, version, well_known.get(name, []), by_scope)
        now[name] = (parts, version, table)
        tables.append(table)
    scopes = [scope(key) for key in sorted(keys)] if by_scope else []
    unkeyed = unkeyed_routes(site) if options.route_scopes else ()
    return RouteTables(tables, scopes, unkeyed), rendered, now


@functools.lru_cache(maxsize=65_536)
def scope(key: str) -> scoped_route_pb2.ScopedRouteConfiguration:
    """The scope of `key`: one object per key (never changed once built), so an unchanged scope costs
    a publication nothing (`Snapshot.build` reuses what it serialised for the same object)."""
    return scoped_route_pb2.ScopedRouteConfiguration(
        name=f"{SCOPE_NAME_PREFIX}{key}",
        route_configuration_name=table_name(key),
        key=scoped_route_pb2.ScopedRouteConfiguration.Key(
            fragments=[scoped_route_pb2.ScopedRouteConfiguration.Key.Fragment(string_key=key)]
        ),
    )


def route_table(
    name: str,
    parts: tuple[bytes, ...],
    proc_version: str | None,
    well_known: list[route_components_pb2.Route],
    by_scope: bool,
) -> route_pb2.RouteConfiguration:
    removed = [*CLIENT_HEADERS_REMOVED, SCOPE_KEY_HEADER] if by_scope else list(CLIENT_HEADERS_REMOVED)
    config = route_pb2.RouteConfiguration(name=name, request_headers_to_remove=removed)
    host = config.virtual_hosts.add(name=VIRTUAL_HOST_NAME, domains=["*"])
    for filter_name, per_filter in virtual_host_configs(proc_version).items():
        host.typed_per_filter_config[filter_name].CopyFrom(per_filter)
    host.routes.extend(_refuse_path(n, pattern) for n, pattern in REFUSAL_ROUTES)
    # Exact paths, before every prefix entry (a route with prefix "/" would take them otherwise).
    host.routes.extend(well_known)
    # Parsed in place: appending a built virtual host would copy all of its entries once more.
    host.MergeFromString(b"".join(parts))
    return config


# How soon a client told to come back (on a connection a newer listener accepts) may do so.
CLOSED_RETRY_AFTER_S = 1


@functools.cache
def closed_table() -> route_pb2.RouteConfiguration:
    """The one table as served while the routes go by scope (module docstring, "Closed")."""
    config = route_pb2.RouteConfiguration(name=ROUTE_CONFIG_NAME)
    host = config.virtual_hosts.add(name=VIRTUAL_HOST_NAME, domains=["*"])
    entry = host.routes.add(
        name="stoa-routing-replaced",
        match=route_components_pb2.RouteMatch(prefix="/"),
        direct_response=route_components_pb2.DirectResponseAction(
            status=503, body=base_pb2.DataSource(inline_string=DENY_BODIES[503].decode())
        ),
    )
    for name, value in (("content-type", CONTENT_TYPE), ("retry-after", str(CLOSED_RETRY_AFTER_S))):
        entry.response_headers_to_add.add(
            header=base_pb2.HeaderValue(key=name, value=value),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
    entry.typed_per_filter_config[EXT_AUTHZ_FILTER].CopyFrom(packed(EXT_AUTHZ_DISABLED))
    return config


def _refuse_path(name: str, pattern: str) -> route_components_pb2.Route:
    # No body here: the listener's local-reply mapping gives every Envoy 400 the neutral JSON body.
    entry = route_components_pb2.Route(
        name=name,
        match=route_components_pb2.RouteMatch(safe_regex=regex_pb2.RegexMatcher(regex=pattern)),
        direct_response=route_components_pb2.DirectResponseAction(status=400),
    )
    entry.typed_per_filter_config[EXT_AUTHZ_FILTER].CopyFrom(packed(EXT_AUTHZ_DISABLED))
    return entry


def _methods(route: RouteIR) -> tuple[str, ...]:
    """The methods to match; () = any. A kind may add some (cors: OPTIONS, for the preflight)."""
    if not route.methods:
        return ()
    extra = [m for name, _ in route.policies for m in KINDS[name].extra_methods if m not in route.methods]
    return (*route.methods, *dict.fromkeys(extra))


def per_route_configs(route: RouteIR, options: TranslateOptions) -> dict[str, any_pb2.Any]:
    """typed_per_filter_config of every route entry rendered for `route`: the filters it switches on
    (all but the Check are off on the listener), each with the route's config."""
    configs = _decision_configs(route, options)
    kinds: dict[str, message.Message] = {}
    for name, ir in route.policies:
        for filter_name, config in KINDS[name].per_route(route.route_id, ir).items():
            # Kinds served by the processing service share its filter: one config, the union of phases.
            shared = kinds.get(filter_name)
            kinds[filter_name] = config if shared is None else merge_ext_proc_routes(shared, config)
    buffered = route.request_buffer_bytes()
    if buffered is not None:
        kinds[BUFFER_FILTER] = buffer_route(buffered)
        if route.skips_request_headers():
            # The body it passes is the one inspected (such a route never rewrites it): same limit.
            kinds[PROCESSED_BUFFER_FILTER] = buffer_route(buffered)
    configs.update((name, packed(config)) for name, config in kinds.items())
    return configs


def route_entries(route: RouteIR, options: TranslateOptions) -> list[route_components_pb2.Route]:
    action = route_components_pb2.RouteAction(
        cluster=route.backend.cluster_name,
        timeout=_millis(route.timeout_ms or options.default_route_timeout_ms),
    )
    if route.kind == MCP_KIND:
        # The module serves streams (GET) that outlive any request timeout; tools/call is bounded by
        # the module itself. Never retried: Envoy has no retry policy on any route.
        action.timeout.FromMilliseconds(0)
    else:
        action.host_rewrite_literal = route.backend.authority
        _rewrite(route, action)
    identity = _identity_headers(route)
    configs = per_route_configs(route, options)
    entries = []
    for method in _methods(route) or (None,):
        match = route_components_pb2.RouteMatch()
        if route.path_prefix == "/":
            match.prefix = "/"
        else:
            match.path_separated_prefix = route.path_prefix
        if method is not None:
            match.headers.append(
                route_components_pb2.HeaderMatcher(
                    name=":method", string_match=string_pb2.StringMatcher(exact=method)
                )
            )
        entry = route_components_pb2.Route(
            name=f"{route.route_id}:{method or 'ANY'}",
            match=match,
            route=action,
            request_headers_to_add=identity,
        )
        if route.auth_mode != "none" and not route.forward_credential:
            entry.request_headers_to_remove.append(route.key_header or CREDENTIAL_HEADER)
        for name, config in configs.items():
            entry.typed_per_filter_config[name].CopyFrom(config)
        entries.append(entry)
    return entries


def _decision_configs(route: RouteIR, options: TranslateOptions) -> dict[str, any_pb2.Any]:
    """Who decides this route: the Check (its context), or Envoy's filters (the Check disabled)."""
    if route.placement == placement.SERVICE:
        return {EXT_AUTHZ_FILTER: packed(_check_context(route))}
    configs = {}
    if route.placement == placement.ENVOY:
        configs[EXT_AUTHZ_FILTER] = packed(placement.NO_CHECK)
        if route.auth_mode == "jwt":
            configs[CLAIMS_RBAC_FILTER] = packed(claims.claims_config(route, options))
    else:
        configs[EXT_AUTHZ_FILTER] = packed(_check_context(route))
        if route.auth_mode == "jwt":
            configs[CLAIMS_RBAC_FILTER] = packed(claims.trust_config(route))
    if route.auth_mode == "jwt":
        configs[REQUEST_RBAC_FILTER] = packed(claims.request_config())
        configs[JWT_AUTHN_FILTER] = packed(jwt_authn.route_config(route))
    return configs


def _check_context(route: RouteIR) -> ext_authz_pb2.ExtAuthzPerRoute:
    return ext_authz_route(route.tenant_id, route.api_id, route.route_id, route_version_of(route))


def _identity_headers(route: RouteIR) -> list[base_pb2.HeaderValueOption]:
    """What Envoy tells the upstream about a request it decided (the service says it on its own)."""
    if route.placement != placement.ENVOY:
        return []
    return [
        base_pb2.HeaderValueOption(
            header=base_pb2.HeaderValue(key=name, value=value),
            append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
        )
        for name, value in ((TENANT_HEADER, route.tenant_id), (API_HEADER, route.api_id))
    ]


def _millis(ms: int) -> duration_pb2.Duration:
    duration = duration_pb2.Duration()
    duration.FromMilliseconds(ms)
    return duration


def _rewrite(route: RouteIR, action: route_components_pb2.RouteAction) -> None:
    if route.path_prefix == "/":
        if route.base_path != "/":
            action.prefix_rewrite = route.base_path + "/"
        return
    if route.base_path != "/":
        action.prefix_rewrite = route.base_path
        return
    # A plain prefix_rewrite to "/" would turn /apis/x/foo into //foo; drop the prefix and one slash.
    action.regex_rewrite.CopyFrom(
        regex_pb2.RegexMatchAndSubstitute(
            pattern=regex_pb2.RegexMatcher(regex=f"^{re.escape(route.path_prefix)}/?"), substitution="/"
        )
    )
