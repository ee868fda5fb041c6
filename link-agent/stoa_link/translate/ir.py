"""Inventory → intermediate representation: validated, resolved, Envoy-free.

Every refusal the translator makes is made here (UNSUPPORTED_POLICY, DUPLICATE_POLICY,
INVALID_INVENTORY), so the renderers only ever see content they can express. The IR is plain frozen
data in a deterministic order (routes by route id, issuers by tenant then issuer).
"""

from __future__ import annotations

import dataclasses
import functools
import ipaddress
import math
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from google.protobuf import json_format
from stoa_proto import inventory_pb2

from stoa_link.guard import FailureReason, Refusal

CORS = "cors"
RATE_LIMIT = "rate_limit"
IP_FILTER = "ip_filter"
SUPPORTED_POLICY_TYPES = (CORS, RATE_LIMIT, IP_FILTER)

AUTH_MODES = ("jwt", "none")
DEFAULT_AUTH_MODE = "jwt"

_METHOD = re.compile(r"^[A-Z]+$")
_HOST_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")
# A path (prefix or upstream base) of RFC 3986 path characters; no query, fragment, blank or control.
_PATH = re.compile(r"^(/[A-Za-z0-9\-._~!$&'()*+,;=:@%]+)+$")
_IP_LIKE = re.compile(r"^[0-9.]+$|:")
_WILDCARD_ORIGIN = re.compile(r"^(https?)://\*\.([A-Za-z0-9.-]+)(:\d{1,5})?$")


@dataclass(frozen=True)
class Backend:
    """One upstream identity; every route with the same identity shares one cluster."""

    scheme: str
    host: str
    port: int
    is_ip: bool

    @property
    def cluster_name(self) -> str:
        return f"backend_{self.scheme}_{self.host}_{self.port}"

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = 443 if self.scheme == "https" else 80
        return host if self.port == default_port else f"{host}:{self.port}"


@dataclass(frozen=True)
class Cors:
    policy_id: str
    allowed_origins: tuple[str, ...]
    allowed_methods: tuple[str, ...]
    allowed_headers: tuple[str, ...]
    expose_headers: tuple[str, ...]
    max_age: int | None
    allow_credentials: bool


@dataclass(frozen=True)
class RateLimit:
    policy_id: str
    max_requests: int
    interval_seconds: int


@dataclass(frozen=True)
class IpFilter:
    policy_id: str
    mode: str  # "allow" | "deny"
    cidrs: tuple[tuple[str, int], ...]  # (network address, prefix length)


@dataclass(frozen=True)
class RouteIR:
    route_id: str
    tenant_id: str
    api_id: str
    # Without a trailing slash ("/" only for the catch-all prefix).
    path_prefix: str
    # Sorted; empty means every method.
    methods: tuple[str, ...]
    backend: Backend
    # The upstream base path replacing path_prefix, without a trailing slash ("/" for none).
    base_path: str
    timeout_ms: int  # 0 = the Link's default
    auth_mode: str
    scopes: tuple[str, ...]
    cors: Cors | None
    rate_limit: RateLimit | None
    ip_filter: IpFilter | None


@dataclass(frozen=True)
class IssuerIR:
    tenant_id: str
    issuer: str
    jwks_json: str
    jwks_uri: str


@dataclass(frozen=True)
class SiteIR:
    gateway_id: str
    generation: int
    routes: tuple[RouteIR, ...]
    issuers: tuple[IssuerIR, ...]

    def needs(self, policy_type: str) -> bool:
        return any(getattr(route, policy_type) is not None for route in self.routes)


# Route content (deterministic serialisation) → its IR without policies, from the latest build: a
# change of one route among 10,000 resolves one route again, not all of them. Content-keyed, so the
# result is what `_route` gives; only routes that passed validation are kept.
_resolved: dict[bytes, RouteIR] = {}


def _invalid(detail: str) -> Refusal:
    return Refusal(FailureReason.INVALID_INVENTORY, detail)


def build(inventory: inventory_pb2.Inventory) -> SiteIR:
    """Validate `inventory` and resolve each route's policies; raise `Refusal` on anything unusable."""
    policies = _resolve_policies(inventory)
    tombstoned = {tombstone.route_id for tombstone in inventory.tombstones}
    routes: list[RouteIR] = []
    seen_prefixes: dict[str, str] = {}
    resolved: dict[bytes, RouteIR] = {}
    for route in sorted(inventory.routes, key=lambda r: r.route_id):
        if routes and routes[-1].route_id == route.route_id:
            raise _invalid(f"route {route.route_id}: duplicate route id")
        if route.route_id in tombstoned:
            raise _invalid(f"route {route.route_id}: both present and tombstoned")
        key = route.SerializeToString(deterministic=True)
        ir = _resolved.get(key) or _route(route)
        resolved[key] = ir
        own = policies.get(route.route_id)
        if own:
            ir = dataclasses.replace(ir, **own)
        other = seen_prefixes.setdefault(ir.path_prefix, ir.route_id)
        if other != ir.route_id:
            raise _invalid(f"routes {other} and {ir.route_id}: same path prefix {ir.path_prefix}")
        routes.append(ir)
    tenants = {route.tenant_id for route in routes}
    issuers = sorted(
        (
            IssuerIR(i.tenant_id, i.issuer, i.jwks_json, i.jwks_uri)
            for i in inventory.issuers
            if i.tenant_id in tenants
        ),
        key=lambda i: (i.tenant_id, i.issuer),
    )
    for issuer in issuers:
        if not issuer.issuer:
            raise _invalid(f"tenant {issuer.tenant_id}: trusted issuer without an issuer name")
    _resolved.clear()
    _resolved.update(resolved)
    return SiteIR(inventory.gateway_id, inventory.generation, tuple(routes), tuple(issuers))


def _route(route: inventory_pb2.Route) -> RouteIR:
    """The route's IR without its policies (`build` adds them)."""
    where = f"route {route.route_id or '<empty>'}"
    for name in ("route_id", "tenant_id", "api_id"):
        if not getattr(route, name).strip():
            raise _invalid(f"{where}: {name} is empty")
    prefix = _path_prefix(route.path_prefix or f"/apis/{route.api_id}", where)
    methods = tuple(sorted(set(route.methods)))
    for method in methods:
        if not _METHOD.match(method):
            raise _invalid(f"{where}: method {method!r} is not an upper-case HTTP method")
    backend, base_path = _upstream(route.upstream_url, where)
    auth_mode = route.auth_mode or DEFAULT_AUTH_MODE
    if auth_mode not in AUTH_MODES:
        raise _invalid(f"{where}: auth_mode {auth_mode!r} is not one of {', '.join(AUTH_MODES)}")
    scopes = tuple(route.scopes)
    if any(not scope.strip() for scope in scopes):
        raise _invalid(f"{where}: blank scope")
    return RouteIR(
        route_id=route.route_id,
        tenant_id=route.tenant_id,
        api_id=route.api_id,
        path_prefix=prefix,
        methods=methods,
        backend=backend,
        base_path=base_path,
        timeout_ms=route.timeout_ms,
        auth_mode=auth_mode,
        scopes=scopes,
        cors=None,
        rate_limit=None,
        ip_filter=None,
    )


def _path_prefix(raw: str, where: str) -> str:
    prefix = raw.rstrip("/")
    if not prefix:
        return "/"
    if not _PATH.match(prefix) or any(seg in (".", "..") for seg in prefix.split("/")):
        raise _invalid(f"{where}: path_prefix {raw!r} is not a normalised absolute path")
    return prefix


def _upstream(url: str, where: str) -> tuple[Backend, str]:
    try:
        return _backend(url)
    except ValueError:
        raise _invalid(f"{where}: upstream_url {url!r} is not http(s)://host[:port][/path]") from None


# Routes mostly share a handful of upstreams: a URL is parsed once, not once per route (10,000).
@functools.lru_cache(maxsize=16384)
def _backend(url: str) -> tuple[Backend, str]:
    """(backend, base path) of an upstream URL; ValueError if it is not http(s)://host[:port][/path]."""
    bad = ValueError(url)
    parts = urlsplit(url)
    port = parts.port
    # Port 0 is no port: without this check `port or default_port` would quietly dial 80/443.
    if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
        raise bad
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise bad
    if "?" in url or "#" in url:
        raise bad
    host = parts.hostname
    address = None
    if _IP_LIKE.search(host):  # skip the costly parse for plain host names (10,000 routes)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise bad from None
    if address is None:
        if "[" in parts.netloc or not all(_HOST_LABEL.match(label) for label in host.split(".")):
            raise bad
        host = host.lower()
    else:
        host = str(address)
    base = parts.path.rstrip("/")
    if base and (not _PATH.match(base) or any(seg in (".", "..") for seg in base.split("/"))):
        raise bad
    default_port = 443 if parts.scheme == "https" else 80
    backend = Backend(parts.scheme, host, port or default_port, address is not None)
    return backend, base or "/"


def _resolve_policies(inventory: inventory_pb2.Inventory) -> dict[str, dict[str, Any]]:
    """Route id → {policy type → parsed policy}; refuses unsupported types and same-type overlaps."""
    ordered = sorted(inventory.policies, key=lambda p: p.policy_id)
    seen_ids: set[str] = set()
    for policy in ordered:
        if not policy.policy_id.strip():
            raise _invalid("policy with an empty policy_id")
        if policy.policy_id in seen_ids:
            raise _invalid(f"policy {policy.policy_id}: duplicate policy id")
        seen_ids.add(policy.policy_id)
        # Refused whether or not it applies anywhere: the Link never half-supports a type.
        if policy.type not in SUPPORTED_POLICY_TYPES:
            raise Refusal(
                FailureReason.UNSUPPORTED_POLICY,
                f"policy {policy.policy_id}: type {policy.type or '<empty>'} is not supported",
            )
    present = {route.route_id for route in inventory.routes}
    by_route: dict[str, dict[str, Any]] = {}
    owner: dict[tuple[str, str], str] = {}
    for policy in ordered:
        parsed = _PARSERS[policy.type](policy.policy_id, json_format.MessageToDict(policy.config))
        for route_id in sorted(set(policy.applicable) & present):
            first = owner.setdefault((route_id, policy.type), policy.policy_id)
            if first != policy.policy_id:
                raise Refusal(
                    FailureReason.DUPLICATE_POLICY,
                    f"route {route_id}: policies {first} and {policy.policy_id} are both of type "
                    f"{policy.type}",
                )
            by_route.setdefault(route_id, {})[policy.type] = parsed
    return by_route


class _Config:
    """Typed reads of one policy's config, refusing anything unexpected with the key named."""

    def __init__(self, policy_id: str, config: dict[str, Any], keys: tuple[str, ...]) -> None:
        self.policy_id = policy_id
        self.config = config
        unknown = sorted(set(config) - set(keys))
        if unknown:
            raise self.invalid(unknown[0], "is not a known key")

    def invalid(self, key: str, what: str) -> Refusal:
        return _invalid(f"policy {self.policy_id}: config.{key} {what}")

    def strings(self, key: str, *, required: bool = False) -> tuple[str, ...]:
        value = self.config.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.invalid(key, "must be a list of non-empty strings")
        if required and not value:
            raise self.invalid(key, "must not be empty")
        return tuple(value)

    def integer(self, key: str, *, minimum: int) -> int:
        value = self.config.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value != int(value)
            or value < minimum
            or value > 2**32 - 1
        ):
            raise self.invalid(key, f"must be a whole number of at least {minimum}")
        return int(value)

    def optional_integer(self, key: str, *, minimum: int) -> int | None:
        return None if self.config.get(key) is None else self.integer(key, minimum=minimum)

    def boolean(self, key: str) -> bool:
        value = self.config.get(key, False)
        if not isinstance(value, bool):
            raise self.invalid(key, "must be true or false")
        return value


def _cors(policy_id: str, config: dict[str, Any]) -> Cors:
    c = _Config(
        policy_id,
        config,
        ("allowedOrigins", "allowedMethods", "allowedHeaders", "exposeHeaders", "maxAge", "allowCredentials"),
    )
    origins = c.strings("allowedOrigins", required=True)
    for origin in origins:
        if origin != "*" and "*" in origin and not _WILDCARD_ORIGIN.match(origin):
            raise c.invalid("allowedOrigins", f"entry {origin!r} is not an origin, '*' or scheme://*.domain")
    methods = c.strings("allowedMethods")
    if not all(_METHOD.match(m) for m in methods):
        raise c.invalid("allowedMethods", "must hold upper-case HTTP methods")
    credentials = c.boolean("allowCredentials")
    if credentials and "*" in origins:
        raise c.invalid("allowCredentials", "cannot be true with the '*' origin")
    return Cors(
        policy_id=policy_id,
        allowed_origins=origins,
        allowed_methods=methods,
        allowed_headers=c.strings("allowedHeaders"),
        expose_headers=c.strings("exposeHeaders"),
        max_age=c.optional_integer("maxAge", minimum=0),
        allow_credentials=credentials,
    )


def _rate_limit(policy_id: str, config: dict[str, Any]) -> RateLimit:
    c = _Config(policy_id, config, ("maxRequests", "intervalSeconds"))
    return RateLimit(policy_id, c.integer("maxRequests", minimum=1), c.integer("intervalSeconds", minimum=1))


def _ip_filter(policy_id: str, config: dict[str, Any]) -> IpFilter:
    c = _Config(policy_id, config, ("mode", "ip_list"))
    mode = config.get("mode")
    if mode not in ("allow", "deny"):
        raise c.invalid("mode", "must be 'allow' or 'deny'")
    cidrs: list[tuple[str, int]] = []
    for entry in c.strings("ip_list", required=True):
        try:
            # strict=False: host bits in a CIDR are masked, the range matched is the same.
            network = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            raise c.invalid("ip_list", f"entry {entry!r} is not an IP address or CIDR") from None
        cidrs.append((str(network.network_address), network.prefixlen))
    return IpFilter(policy_id, mode, tuple(sorted(set(cidrs))))


_PARSERS = {CORS: _cors, RATE_LIMIT: _rate_limit, IP_FILTER: _ip_filter}
