"""Inventory → intermediate representation: validated, resolved, Envoy-free.

Every refusal about content is made here (UNSUPPORTED_POLICY, DUPLICATE_POLICY, INVALID_INVENTORY),
so the renderers only ever see content they can express; each policy kind parses its own config
(`stoa_translate.policies`). The IR is plain frozen data in a deterministic order (routes by route
id, issuers by tenant then issuer).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import json_format, message
from stoa_proto import inventory_pb2, mcp_pb2

from stoa_translate import fields
from stoa_translate import tools as tool_rules
from stoa_translate.policies import KINDS, PROCESSING_KINDS, ConfigError
from stoa_translate.refusal import FailureReason, Refusal, invalid

DEFAULT_AUTH_MODE = "jwt"
MCP_KIND = "mcp"
MCP_MODULE_CLUSTER = "stoa_mcp_module"


@dataclass(frozen=True)
class Backend:
    """One upstream identity; every route with the same identity shares one cluster."""

    scheme: str
    host: str
    port: int
    is_ip: bool

    @property
    def cluster_name(self) -> str:
        if self.scheme == MCP_KIND:
            return MCP_MODULE_CLUSTER
        return f"backend_{self.scheme}_{self.host}_{self.port}"

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default_port = 443 if self.scheme == "https" else 80
        return host if self.port == default_port else f"{host}:{self.port}"


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
    # The client's Authorization reaches the upstream (only ever removed when the route checks a token).
    forward_credential: bool = False
    # The upstream gets the signed identity envelope (so the authorization service decides).
    envelope: bool = False
    # (kind name, the kind's IR), by kind name: at most one policy of a kind per route.
    policies: tuple[tuple[str, Any], ...] = ()
    # Where the route's decision runs (`stoa_translate.decision.placement`); set after `build`.
    placement: str = "service"
    # "" (proxied to its backend) or "mcp" (to the site's MCP module, path kept as is).
    kind: str = ""
    # api_key: the request header holding the key (removed before the upstream like a token).
    key_header: str = ""
    # jwt: the token's consumer must hold an active subscription to this API.
    subscription: bool = False
    # Where jwt_authn verifies the token: the tenant's issuers and their key ids at this translation
    # (`placement.Trust`), checked again after the signature, since a listener older than the last
    # change of those issuers may still hold a removed one; set with the placement.
    trust: tuple[tuple[str, tuple[str, ...]], ...] = ()

    def __hash__(self) -> int:
        # Hashed once per object: a route is a dictionary key several times in every translation
        # (10,000 look-ups for a one-route change), and the generated hash walks every field each time.
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash(tuple(getattr(self, f.name) for f in dataclasses.fields(self)))
            object.__setattr__(self, "_hash", cached)
        return cached

    def policy(self, kind: str) -> Any | None:
        if not self.policies:  # most routes: asked once per kind per route per translation
            return None
        return next((ir for name, ir in self.policies if name == kind), None)

    def uses_processing(self) -> bool:
        """Whether a policy of the route is one the processing service applies."""
        return any(name in PROCESSING_KINDS for name, _ in self.policies)

    def request_buffer_bytes(self) -> int | None:
        """The request-body limit when a policy of the route inspects the whole request body (0: the
        default limit), else None; the smallest when several do."""
        limits = [
            ir.request_buffer_bytes
            for _, ir in self.policies
            if getattr(ir, "request_buffer_bytes", None) is not None
        ]
        if not limits:
            return None
        named = [limit for limit in limits if limit]
        return min(named) if named else 0

    def skips_request_headers(self) -> bool:
        """Whether the route's processing only inspects the buffered request body: no kind of it needs
        the request-headers message (each kind's mode says the same; their merge keeps it skipped
        only then)."""
        kinds = [ir for name, ir in self.policies if name in PROCESSING_KINDS]
        return bool(kinds) and not any(ir.sends_request_headers for ir in kinds)


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
    # The tools of the tenants with an MCP route here, by (tenant, name); checked by the tool rules.
    tools: tuple[mcp_pb2.Tool, ...] = ()
    # Consumers (by tenant, consumer id) and subscriptions (by tenant, subscription id), as delivered.
    consumers: tuple[inventory_pb2.Consumer, ...] = ()
    subscriptions: tuple[inventory_pb2.Subscription, ...] = ()
    # Sorted, unique.
    revoked_key_sha256: tuple[str, ...] = ()

    def needs_mcp(self) -> bool:
        return any(route.kind == MCP_KIND for route in self.routes)

    def __post_init__(self) -> None:
        # Whether the processing set is in use, gathered once: a walk of 10,000 routes per question
        # was a visible part of a 1-route translation.
        kinds = frozenset(name for route in self.routes if route.policies for name, _ in route.policies)
        object.__setattr__(self, "_kinds", kinds)

    def needs_processing(self) -> bool:
        return not self._kinds.isdisjoint(PROCESSING_KINDS)  # type: ignore[attr-defined]


# Route content (deterministic serialisation) → its IR without policies. Content-keyed, so a hit is
# what `_route` gives; only routes that passed validation are ever in it.
ResolvedRoutes = Mapping[bytes, RouteIR]

_invalid = invalid


def build(
    inventory: inventory_pb2.Inventory, previous: ResolvedRoutes
) -> tuple[SiteIR, dict[bytes, RouteIR]]:
    """Validate `inventory` and resolve each route's policies; raise `Refusal` on anything unusable.

    `previous` is what the last build resolved (returned second): a change of one route among
    10,000 resolves one route again, not all of them.
    """
    policies = _resolve_policies(inventory)
    tombstoned = {tombstone.route_id for tombstone in inventory.tombstones}
    routes: list[RouteIR] = []
    seen_prefixes: dict[str, str] = {}
    resolved: dict[bytes, RouteIR] = {}
    backends: dict[str, tuple[Backend, str] | str] = {}
    for route in sorted(inventory.routes, key=lambda r: r.route_id):
        if routes and routes[-1].route_id == route.route_id:
            raise _invalid(f"route {route.route_id}: duplicate route id")
        if route.route_id in tombstoned:
            raise _invalid(f"route {route.route_id}: both present and tombstoned")
        key = route.SerializeToString(deterministic=True)
        ir = previous.get(key) or route_ir(route, backends)
        resolved[key] = ir
        own = policies.get(route.route_id)
        if own:
            ir = dataclasses.replace(ir, policies=tuple(sorted(own.items())))
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
    mcp_tenants = {route.tenant_id for route in routes if route.kind == MCP_KIND}
    tools = tuple(
        sorted(
            (t for t in inventory.tools if t.tenant_id in mcp_tenants), key=lambda t: (t.tenant_id, t.name)
        )
    )
    _check_tools(tools)
    consumers, subscriptions = _consumers(inventory, tenants)
    site = SiteIR(
        inventory.gateway_id,
        inventory.generation,
        tuple(routes),
        tuple(issuers),
        tools,
        consumers,
        subscriptions,
        tuple(sorted(set(_digests(inventory.revoked_key_sha256, "revoked key")))),
    )
    return site, resolved


def _check_tools(tools: tuple[mcp_pb2.Tool, ...]) -> None:
    """The tool rules the CP applied at the write (`stoa_translate.tools`), as the site's own defence."""
    seen: set[tuple[str, str]] = set()
    for tool in tools:
        where = f"tool {tool.tenant_id}/{tool.name}"
        if (tool.tenant_id, tool.name) in seen:
            raise _invalid(f"{where}: duplicate tool name")
        seen.add((tool.tenant_id, tool.name))
        try:
            tool_rules.read(tool)
            fields.upstream_url(tool.upstream_url)
        except ValueError as exc:
            raise _invalid(f"{where}: {exc}") from None


def _digests(values: Any, where: str) -> list[str]:
    for value in values:
        if len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
            raise _invalid(f"{where}: {value[:16]!r}... is not a SHA-256 in lower-case hex")
    return list(values)


def _consumers(
    inventory: inventory_pb2.Inventory, tenants: set[str]
) -> tuple[tuple[inventory_pb2.Consumer, ...], tuple[inventory_pb2.Subscription, ...]]:
    """The consumers and subscriptions of the tenants routed here, checked and in a fixed order."""
    consumers = sorted(
        (c for c in inventory.consumers if c.tenant_id in tenants), key=lambda c: (c.tenant_id, c.consumer_id)
    )
    seen: set[tuple[str, str]] = set()
    for consumer in consumers:
        where = f"consumer {consumer.consumer_id!r} of tenant {consumer.tenant_id!r}"
        if not consumer.consumer_id.strip():
            raise _invalid(f"{where}: consumer_id is empty")
        if (consumer.tenant_id, consumer.consumer_id) in seen:
            raise _invalid(f"{where}: listed twice")
        seen.add((consumer.tenant_id, consumer.consumer_id))
        _digests(consumer.key_sha256, f"{where}: key")
    subscriptions = sorted(
        (s for s in inventory.subscriptions if s.tenant_id in tenants),
        key=lambda s: (s.tenant_id, s.subscription_id),
    )
    for sub in subscriptions:
        where = f"subscription {sub.subscription_id!r} of tenant {sub.tenant_id!r}"
        if (sub.tenant_id, sub.consumer_id) not in seen:
            raise _invalid(f"{where}: unknown consumer {sub.consumer_id!r}")
        if sub.requests < 1 or sub.window_seconds < 1:
            raise _invalid(f"{where}: a plan needs requests and window_seconds of at least 1")
    return tuple(consumers), tuple(subscriptions)


def route_ir(route: inventory_pb2.Route, backends: dict[str, tuple[Backend, str] | str]) -> RouteIR:
    """The route's IR without its policies (`build` adds them)."""
    where = f"route {route.route_id or '<empty>'}"
    for name in ("route_id", "tenant_id", "api_id"):
        if not getattr(route, name).strip():
            raise _invalid(f"{where}: {name} is empty")
    try:
        prefix = fields.path(route.path_prefix or f"/apis/{route.api_id}")
    except ValueError as exc:
        raise _invalid(f"{where}: path_prefix {route.path_prefix!r} {exc}") from None
    try:
        methods = tuple(sorted(fields.methods(route.methods)))
    except ValueError as exc:
        raise _invalid(f"{where}: methods: {exc}") from None
    if route.kind not in ("", MCP_KIND):
        raise _invalid(f"{where}: kind {route.kind!r} is not one of http (''), mcp")
    if route.kind == MCP_KIND:
        if route.upstream_url:
            raise _invalid(f"{where}: an MCP route has no upstream_url")
        if not route.envelope:
            raise _invalid(f"{where}: an MCP route needs the identity envelope (its callers' identity)")
        # The module reads the route from the envelope; the path reaches it as the client sent it.
        backend, base_path = Backend(MCP_KIND, "", 0, True), ""
    else:
        backend, base_path = _upstream(route.upstream_url, where, backends)
    try:
        auth_mode = fields.auth_mode(route.auth_mode or DEFAULT_AUTH_MODE)
        scopes = tuple(fields.scopes(route.scopes))
        key_header = ""
        if auth_mode == "api_key":
            key_header = fields.key_header(route.key_header or fields.DEFAULT_KEY_HEADER)
    except ValueError as exc:
        raise _invalid(f"{where}: {exc}") from None
    if route.envelope and auth_mode == "none":
        raise _invalid(f"{where}: the identity envelope needs a token (auth_mode jwt)")
    if route.subscription and auth_mode != "jwt":
        raise _invalid(f"{where}: subscription is only for auth mode jwt")
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
        forward_credential=route.forward_credential,
        envelope=route.envelope,
        kind=route.kind,
        key_header=key_header,
        subscription=route.subscription,
    )


def _upstream(url: str, where: str, backends: dict[str, tuple[Backend, str] | str]) -> tuple[Backend, str]:
    """(backend, base path) of `url`, parsed once per build (routes mostly share a few upstreams)."""
    known = backends.get(url)
    if known is None:
        try:
            upstream = fields.upstream_url(url)
            known = Backend(upstream.scheme, upstream.host, upstream.port, upstream.is_ip), upstream.base_path
        except ValueError as exc:
            known = f"{where}: upstream_url {url!r} {exc}"
        backends[url] = known
    if isinstance(known, str):
        raise _invalid(known)
    return known


def _resolve_policies(inventory: inventory_pb2.Inventory) -> dict[str, dict[str, Any]]:
    """Route id → {kind name → the kind's IR}; refuses unsupported kinds and same-kind overlaps."""
    ordered = sorted(inventory.policies, key=lambda p: p.policy_id)
    seen_ids: set[str] = set()
    for policy in ordered:
        if not policy.policy_id.strip():
            raise _invalid("policy with an empty policy_id")
        if policy.policy_id in seen_ids:
            raise _invalid(f"policy {policy.policy_id}: duplicate policy id")
        seen_ids.add(policy.policy_id)
        # Refused whether or not it applies anywhere: the Link never half-supports a kind.
        if policy.type not in KINDS:
            raise Refusal(
                FailureReason.UNSUPPORTED_POLICY,
                f"policy {policy.policy_id}: type {policy.type or '<empty>'} is not supported",
            )
    present = {route.route_id for route in inventory.routes}
    by_route: dict[str, dict[str, Any]] = {}
    owner: dict[tuple[str, str], str] = {}
    for policy in ordered:
        # The typed config is the member named like the kind; anything else is not this kind's config.
        if policy.WhichOneof("config") != policy.type:
            raise _invalid(f"policy {policy.policy_id}: type {policy.type} without its {policy.type} config")
        try:
            parsed = KINDS[policy.type].parse(policy.policy_id, getattr(policy, policy.type))
        except ConfigError as exc:
            raise _invalid(f"policy {policy.policy_id}: {exc}") from None
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


def to_json(site: SiteIR) -> dict[str, Any]:
    """The IR as plain JSON data: the golden files of the inventory → IR stage (the tools, consumers
    and subscriptions it keeps as delivered messages in proto3 JSON, every field written)."""
    return _plain(dataclasses.asdict(site))


def _plain(value: Any) -> Any:
    if isinstance(value, message.Message):
        return json_format.MessageToDict(
            value, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
