"""Policy sets: the AuthzPolicySet resources delivered over ADS (`default`, the site-wide part, and the
route buckets), compiled once at load into lookup structures, as one set.

Everything a decision needs is prepared here (parsed public keys per tenant and issuer, routes by id,
scopes as frozensets), so a Check only does dictionary look-ups. A set that cannot be used raises
PolicyError, which the ADS client turns into a NACK; the previous sets stay in force.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from stoa_ops.policy_sets import KeptVersions, Refused
from stoa_proto import authz_pb2, inventory_pb2
from stoa_translate.jwks import KeySetError, VerificationKey, verification_keys_json
from stoa_translate.policy_set import route_version, set_version
from stoa_translate.rego import DEFAULT_ENTRYPOINT, RegoError

from stoa_authz import respond
from stoa_authz.opa import RegoPolicy


class PolicyError(Refused):
    """The policy set is unusable; the message goes into the NACK's error_detail."""


def parse_jwks(text: str, where: str) -> dict[str, VerificationKey]:
    """The issuer's keys for verifying, by the rule the CP accepted them with (`stoa_translate.jwks`)."""
    try:
        return verification_keys_json(text)
    except KeySetError as exc:
        raise PolicyError(f"{where}: JWKS {exc}") from None


@dataclass(slots=True)
class TrustedIssuer:
    issuer: str
    jwks_uri: str
    # Replaced as a whole (never mutated) when an unknown kid triggers a refresh.
    keys: dict[str, VerificationKey]
    last_refresh: float = 0.0


@dataclass(frozen=True, slots=True)
class Route:
    route_id: str
    tenant_id: str
    api_id: str
    auth_none: bool
    scopes: frozenset[str]
    # Envoy's jwt_authn verified the token: the Check reads its payload and never verifies again.
    verified_by_envoy: bool
    # An allow carries the signed identity envelope.
    envelope: bool
    # This route's tenant's trusted issuers, by issuer URL.
    issuers: dict[str, TrustedIssuer]
    # The allow headers of this route without a subject (auth mode none), built at load.
    grant: respond.Grant
    # api_key routes: the request header holding the key ("" for any other mode).
    key_header: str = ""
    # jwt routes: the token's consumer must hold an active subscription to the API.
    subscription: bool = False
    # The route's OPA policy (every request must satisfy it), compiled at load.
    opa: RegoPolicy | None = None
    # The version of the route's entry (`stoa_translate.policy_set.route_version`): what the Envoy
    # route built with this entry names in its Checks.
    version: str = ""


@dataclass(frozen=True, slots=True)
class Subscription:
    subscription_id: str
    consumer_id: str
    plan_id: str
    active: bool
    requests: int
    window_seconds: int
    billed: bool


@dataclass(slots=True)
class PolicySet:
    version: str
    routes: dict[str, Route]
    # Decisions for verified tokens, per set: (route_id, sha256(token)) -> cached decision (see check).
    decisions: OrderedDict[tuple[str, bytes], Any] = field(default_factory=OrderedDict)
    # sha256(key) -> (tenant, consumer) of every live key.
    keys: dict[bytes, tuple[str, str]] = field(default_factory=dict)
    # (tenant, OAuth client id) -> consumer.
    clients: dict[tuple[str, str], str] = field(default_factory=dict)
    # (tenant, consumer, api) -> the consumer's subscription to the API.
    subscriptions: dict[tuple[str, str, str], Subscription] = field(default_factory=dict)


# An issuer-less tenant's routes share this map; nothing ever writes to a route's issuer map.
_NO_ISSUERS: dict[str, TrustedIssuer] = {}
# How many recent compilations a new one may reuse from (the store keeps as many sets by default).
_REUSE_DEPTH = 4


@dataclass(frozen=True, slots=True)
class _Bucket:
    """One route bucket as compiled: reused whole while its version and its tenants' issuer maps are
    the ones in force, and route by route (by content) when a new version of it comes."""

    version: str
    routes: dict[str, Route]
    # The issuer maps its routes hold, by tenant.
    issuers: dict[str, dict[str, TrustedIssuer]]
    # A route's deterministic serialisation → its compiled Route.
    by_content: dict[bytes, Route]


@dataclass(frozen=True, slots=True)
class _Compiled:
    """What one successful compilation produced, by content, for the next ones to reuse."""

    # jwks_json → its parsed keys (importing keys is the costly part of an issuer).
    keys: dict[str, dict[str, VerificationKey]]
    # (tenant, its issuers as delivered: (issuer, jwks_json, jwks_uri) in order) → its issuer map.
    tenants: dict[tuple[str, tuple[tuple[str, str, str], ...]], dict[str, TrustedIssuer]]
    # The routes of the `default` resource: deterministic serialisation → compiled Route.
    routes: dict[bytes, Route]
    # The route buckets by name. A route's bucket follows its id, so an edited route is found again
    # in the previous versions of its own bucket (a bucket reused whole keeps its routes by content).
    buckets: dict[str, _Bucket] = field(default_factory=dict)


# Newest first. Content-keyed, so reuse gives what compiling again would; only the ADS thread (or a
# test) compiles, the lock just keeps two compilations from interleaving their bookkeeping.
_recent: deque[_Compiled] = deque(maxlen=_REUSE_DEPTH)
_recent_lock = threading.Lock()


def compile_policy_set(
    message: authz_pb2.AuthzPolicySet, buckets: Iterable[authz_pb2.AuthzPolicySet] = ()
) -> PolicySet:
    """Compile the set made of `message` (its `default` resource: the site-wide lists, and routes if
    any) and its route `buckets`, reusing what recent compilations prepared for the same content.

    A new version usually differs by a route or two (a deployment, an edit): an unchanged bucket
    keeps its compiled routes as a whole (by name and version), unchanged routes elsewhere their
    compiled Route and unchanged tenants their parsed keys, so the cost follows the change, not the
    estate. Each set gets its own route map; shared Route objects are immutable.
    """
    buckets = tuple(buckets)
    for resource in (message, *buckets):
        if not resource.version:
            raise PolicyError(f"policy set {resource.name or 'default'!r} has no version")
    for bucket in buckets:
        if bucket.issuers or bucket.consumers or bucket.subscriptions or bucket.revoked_key_sha256:
            raise PolicyError(f"policy set {bucket.name!r}: only routes belong in a route bucket")
    with _recent_lock:
        recent = tuple(_recent)
        policy_set, compiled = _compile(message, buckets, recent)
        _recent.appendleft(compiled)
    return policy_set


def _compile(
    message: authz_pb2.AuthzPolicySet,
    buckets: tuple[authz_pb2.AuthzPolicySet, ...],
    recent: tuple[_Compiled, ...],
) -> tuple[PolicySet, _Compiled]:
    done = _Compiled({}, {}, {})
    listed: dict[str, list[inventory_pb2.TrustedIssuer]] = {}
    for issuer in message.issuers:
        where = _where(issuer)
        if not issuer.tenant_id or not issuer.issuer:
            raise PolicyError(f"{where}: tenant_id and issuer are required")
        if not issuer.jwks_json and not issuer.jwks_uri:
            raise PolicyError(f"{where}: neither JWKS nor jwks_uri")
        listed.setdefault(issuer.tenant_id, []).append(issuer)
    issuers: dict[str, dict[str, TrustedIssuer]] = {}
    for tenant_id, delivered in listed.items():
        parsed = [_parsed_keys(i.jwks_json, _where(i), recent, done) for i in delivered]
        for issuer, keys in zip(delivered, parsed, strict=True):
            # Every token of this issuer would fail: refuse the set rather than deny silently.
            if not keys and not issuer.jwks_uri:
                raise PolicyError(f"{_where(issuer)}: no key usable for verifying signatures")
        # Keyed by tenant too: two tenants trusting the same issuer never share its refresh state.
        content = (tenant_id, tuple((i.issuer, i.jwks_json, i.jwks_uri) for i in delivered))
        tenant = next((c.tenants[content] for c in recent if content in c.tenants), None)
        # An issuer refreshed since (unknown kid) holds fetched keys and a refresh clock: a new set
        # starts from the delivered keys, as a fresh compilation would.
        if tenant is None or any(t.last_refresh for t in tenant.values()):
            tenant = {}
            for issuer, keys in zip(delivered, parsed, strict=True):
                if issuer.issuer in tenant:
                    raise PolicyError(f"{_where(issuer)}: listed twice")
                tenant[issuer.issuer] = TrustedIssuer(issuer.issuer, issuer.jwks_uri, keys)
        done.tenants[content] = tenant
        issuers[tenant_id] = tenant
    routes: dict[str, Route] = {}
    _compile_routes(message.routes, routes, issuers, [c.routes for c in recent], done.routes)
    for bucket in buckets:
        if bucket.name in done.buckets:
            raise PolicyError(f"policy set {bucket.name!r}: listed twice")
        before = [b for c in recent if (b := c.buckets.get(bucket.name)) is not None]
        hit = next((b for b in before if b.version == bucket.version), None)
        if hit is not None and all(issuers.get(t, _NO_ISSUERS) is m for t, m in hit.issuers.items()):
            if not routes.keys().isdisjoint(hit.routes):
                raise PolicyError(f"route {min(routes.keys() & hit.routes.keys())!r}: listed twice")
            routes.update(hit.routes)
            done.buckets[bucket.name] = hit
            continue
        own: dict[str, Route] = {}
        by_content: dict[bytes, Route] = {}
        sources = [b.by_content for b in before] + [c.routes for c in recent]
        _compile_routes(bucket.routes, own, issuers, sources, by_content, routes)
        routes.update(own)
        issuer_maps = {r.tenant_id: r.issuers for r in own.values()}
        done.buckets[bucket.name] = _Bucket(bucket.version, own, issuer_maps, by_content)
    policy_set = PolicySet(set_version((message, *buckets)), routes)
    _compile_consumers(message, policy_set)
    return policy_set, done


def _compile_routes(
    listed: Iterable[authz_pb2.AuthzRoute],
    routes: dict[str, Route],
    issuers: dict[str, dict[str, TrustedIssuer]],
    sources: list[dict[bytes, Route]],
    by_content: dict[bytes, Route],
    elsewhere: dict[str, Route] | None = None,
) -> None:
    """Each route of `listed` into `routes` (and `by_content`), reused by content from `sources`
    (recent compilations) where it can be (`elsewhere`: the routes of the set compiled so far, for
    the duplicate check)."""
    for route in listed:
        content_key = route.SerializeToString(deterministic=True)
        tenant = issuers.get(route.tenant_id, _NO_ISSUERS)
        compiled = next((s[content_key] for s in sources if content_key in s), None)
        if compiled is None or compiled.route_id in routes or (elsewhere and compiled.route_id in elsewhere):
            compiled = _compile_route(route, routes, tenant, elsewhere)
        elif compiled.issuers is not tenant:
            compiled = replace(compiled, issuers=tenant)
        routes[compiled.route_id] = compiled
        by_content[content_key] = compiled


def digest_of(hex_digest: str, where: str) -> bytes:
    try:
        raw = bytes.fromhex(hex_digest)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise PolicyError(f"{where}: key digest is not a SHA-256 in hex")
    return raw


def _compile_consumers(message: authz_pb2.AuthzPolicySet, policy_set: PolicySet) -> None:
    """Keys, client ids and subscriptions as look-ups (a Check does one dictionary read each)."""
    for consumer in message.consumers:
        where = f"consumer {consumer.consumer_id!r} of tenant {consumer.tenant_id!r}"
        if not consumer.tenant_id or not consumer.consumer_id:
            raise PolicyError(f"{where}: tenant_id and consumer_id are required")
        owner = (consumer.tenant_id, consumer.consumer_id)
        for hex_digest in consumer.key_sha256:
            if policy_set.keys.setdefault(digest_of(hex_digest, where), owner) != owner:
                raise PolicyError(f"{where}: a key digest is listed for two consumers")
        for client_id in consumer.client_ids:
            if policy_set.clients.setdefault((consumer.tenant_id, client_id), consumer.consumer_id) != (
                consumer.consumer_id
            ):
                raise PolicyError(f"{where}: client id {client_id!r} acts for two consumers")
    for sub in message.subscriptions:
        where = f"subscription {sub.subscription_id!r} of tenant {sub.tenant_id!r}"
        if sub.requests < 1 or sub.window_seconds < 1:
            raise PolicyError(f"{where}: requests and window_seconds must be at least 1")
        key = (sub.tenant_id, sub.consumer_id, sub.api_id)
        compiled = Subscription(
            sub.subscription_id,
            sub.consumer_id,
            sub.plan_id,
            sub.active,
            sub.requests,
            sub.window_seconds,
            sub.billed,
        )
        if policy_set.subscriptions.setdefault(key, compiled) is not compiled:
            raise PolicyError(f"{where}: a second subscription of one consumer to one API")


def _where(issuer: inventory_pb2.TrustedIssuer) -> str:
    return f"issuer {issuer.issuer!r} of tenant {issuer.tenant_id!r}"


def _parsed_keys(
    jwks_json: str, where: str, recent: tuple[_Compiled, ...], done: _Compiled
) -> dict[str, VerificationKey]:
    """The keys of a JWKS document, parsed once while recent compilations hold them (never mutated:
    a refresh replaces an issuer's map)."""
    if not jwks_json:
        return {}
    keys = next((c.keys[jwks_json] for c in (done, *recent) if jwks_json in c.keys), None)
    if keys is None:
        keys = parse_jwks(jwks_json, where)
    done.keys[jwks_json] = keys
    return keys


def _compile_route(
    route: authz_pb2.AuthzRoute,
    routes: dict[str, Route],
    issuers: dict[str, TrustedIssuer],
    elsewhere: dict[str, Route] | None = None,
) -> Route:
    where = f"route {route.route_id!r}"
    if not route.route_id or not route.tenant_id:
        raise PolicyError(f"{where}: route_id and tenant_id are required")
    if route.route_id in routes or (elsewhere and route.route_id in elsewhere):
        raise PolicyError(f"{where}: listed twice")
    if route.auth_mode not in ("", "jwt", "none", "api_key"):
        raise PolicyError(f"{where}: unsupported auth mode {route.auth_mode!r}")
    if (route.auth_mode == "api_key") != bool(route.key_header):
        raise PolicyError(f"{where}: a key header goes with auth mode api_key, and only with it")
    if any(not scope.strip() for scope in route.scopes):
        raise PolicyError(f"{where}: blank scope")
    if route.verified_by_envoy and route.auth_mode == "none":
        raise PolicyError(f"{where}: a route without a token cannot have it verified by Envoy")
    return Route(
        route_id=route.route_id,
        tenant_id=route.tenant_id,
        api_id=route.api_id,
        auth_none=route.auth_mode == "none",
        scopes=frozenset(route.scopes),
        verified_by_envoy=route.verified_by_envoy,
        envelope=route.envelope,
        issuers=issuers,
        grant=respond.grant(route.tenant_id, route.api_id),
        key_header=route.key_header,
        subscription=route.subscription,
        opa=_rego(route, where),
        version=route_version(route),
    )


def _rego(route: authz_pb2.AuthzRoute, where: str) -> RegoPolicy | None:
    if not route.HasField("opa"):
        return None
    try:
        return RegoPolicy(route.route_id, route.opa.module, route.opa.entrypoint or DEFAULT_ENTRYPOINT)
    except RegoError as exc:
        raise PolicyError(f"{where}: OPA module does not compile: {exc}") from None


class PolicyStore(KeptVersions[PolicySet]):
    """The last few accepted policy sets, by version. A Check names its route and the version of the
    route's entry its Envoy route was built with (`route_version`), and is decided with the newest set
    holding that entry: a route built with set N is decided with N while N+1 rolls out or after N+1 is
    refused, and once N+1 is in force with N+1 (its consumers, keys and subscriptions too). A set
    re-sent with the same version keeps the loaded object, and its warm decision cache.

    Key revocations are kept apart, as one set that only grows: every revocation the service was
    ever sent (in a set it accepted or refused) applies to every set, older ones included.
    """

    revoked: frozenset[bytes] = frozenset()

    def revoke(self, digests: Iterable[bytes]) -> None:
        # Replaced, never mutated: Checks on other threads read it without a lock.
        added = frozenset(digests) - self.revoked
        if added:
            self.revoked = self.revoked | added

    def for_route(self, route_id: str, version: str) -> tuple[PolicySet, Route] | None:
        """The newest set holding `route_id` with the entry `version`, and that entry; None if none."""
        for policy_set in reversed(self._sets.values()):
            route = policy_set.routes.get(route_id)
            if route is not None and route.version == version:
                return policy_set, route
        return None

    def knows(self, route_id: str) -> bool:
        """Whether some kept set holds `route_id` (under any version of its entry)."""
        return any(route_id in s.routes for s in self._sets.values())
