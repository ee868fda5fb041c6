"""The Check: the decision phases in order, one `ext_authz_decision` event per decision, and
fail-closed handling of anything unexpected.

A verified token's decision is cached per policy set by (route_id, sha256(token)) until the token
expires: the outcome depends on nothing else (the route and its set are fixed by the key, the
service's audience and scopes by its settings). A cached allow keeps its identity headers and the
fixed part of the envelope's claims; per request remain the envelope (request id, times, signature)
and the removal of the inbound identity headers this request carried.

The gRPC server is the synchronous one (a thread pool): for unary Checks, grpcio's asyncio server
costs about twice the CPU per call (measured by the harness bench `check_cpu`). The
decision event goes to a buffered `DecisionLog` (see bench/PROFILE-authz.md for what each part costs).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import grpc
from envoy.config.core.v3.base_pb2 import Metadata
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from envoy.service.auth.v3.attribute_context_pb2 import AttributeContext
from stoa_ops.logs import DecisionPlace

from stoa_authz import respond
from stoa_authz.authorise import authorise
from stoa_authz.envelope import Envelope
from stoa_authz.identify import LEEWAY_S, Identifier, Identity, bearer_token
from stoa_authz.log import DecisionLog
from stoa_authz.normalise import normalise
from stoa_authz.opa import identity_input, neutral_input
from stoa_authz.policy import PolicySet, PolicyStore, Route, Subscription
from stoa_authz.quotas import Quotas
from stoa_authz.reasons import Deny, Reason
from stoa_authz.strip import strip

log = logging.getLogger("stoa_authz.check")

# Keys the CP issues are 60-odd characters; anything far longer is not one of them.
_MAX_KEY_LENGTH = 512


@dataclass(frozen=True, slots=True)
class DecisionConfig:
    audience: str
    required_scopes: frozenset[str]
    cache_size: int = 10_000


@dataclass(frozen=True, slots=True)
class Decision:
    """The outcome for one verified token on one route of one policy set."""

    expires_at: float
    denial: Reason | None
    grant: respond.Grant | None = None
    claims_prefix: str = ""
    # The subscription each request of this decision is counted against (jwt + subscription).
    subscription: Subscription | None = None
    # The identity part of an OPA policy's input (routes with one only).
    opa_identity: dict[str, Any] | None = None


def request_id(http: AttributeContext.HttpRequest) -> str:
    """The `x-request-id` Envoy forwards upstream, so the envelope and the decision event correlate
    with the upstream's and Envoy's logs; `http.id` is only Envoy's internal stream id."""
    value = http.headers.get("x-request-id") or next(
        (
            e.raw_value.decode("utf-8", "replace") or e.value
            for e in http.header_map.headers
            if e.key.lower() == "x-request-id"
        ),
        "",
    )
    return value or http.id


class Decider:
    def __init__(
        self,
        config: DecisionConfig,
        store: PolicyStore,
        identifier: Identifier,
        envelope: Envelope,
        decision_log: DecisionLog,
        quotas: Quotas | None = None,
    ) -> None:
        self._quotas = quotas or Quotas()
        self._config = config
        self._store = store
        self._identifier = identifier
        self._envelope = envelope
        self._decision_log = decision_log

    def decide(self, request: external_auth_pb2.CheckRequest) -> external_auth_pb2.CheckResponse:
        started = time.perf_counter()
        attributes = request.attributes
        ext = attributes.context_extensions
        http = attributes.request.http
        rid = request_id(http)
        # The version of the policy set the decision was made with, once known (for the event).
        decided_with: list[str] = []
        try:
            response = self._phases(ext, http, rid, attributes.metadata_context, decided_with)
            reason = Reason.ALLOWED
        except Deny as denial:
            reason = denial.reason
            response = respond.deny(reason, denial.headers)
        except Exception:
            # Fail closed; the exception text may quote input, so only its class is logged.
            log.exception("decision_failed")
            reason = Reason.INTERNAL_ERROR
            response = respond.deny(reason)
        self._decision_log.emit(
            "allow" if reason is Reason.ALLOWED else "deny",
            reason.value,
            DecisionPlace(
                tenant=ext.get("tenant_id", ""),
                api=ext.get("api_id", ""),
                route=ext.get("route_id", ""),
                request_id=rid,
                policy_set_version=decided_with[0] if decided_with else "",
            ),
            (time.perf_counter() - started) * 1000,
        )
        return response

    def _phases(
        self,
        ext: Mapping[str, str],
        http: AttributeContext.HttpRequest,
        rid: str,
        metadata: Metadata,
        decided_with: list[str],
    ) -> external_auth_pb2.CheckResponse:
        if not self._config.audience:
            raise Deny(Reason.NOT_CONFIGURED)
        headers = normalise(http)
        route_id = ext.get("route_id", "")
        found = self._store.for_route(route_id, ext.get("route_version", ""))
        if found is None:
            # A route some kept set has under another entry was built with a set no longer held.
            if not self._store or self._store.knows(route_id):
                raise Deny(Reason.POLICY_UNAVAILABLE)
            raise Deny(Reason.UNKNOWN_ROUTE)
        policy, route = found
        decided_with.append(policy.version)
        if ext.get("tenant_id", route.tenant_id) != route.tenant_id:
            raise Deny(Reason.UNKNOWN_ROUTE)
        stripped = strip(headers, route.key_header)

        def evaluate(identity: dict[str, Any]) -> None:
            """The route's OPA policy, if any, after its own checks and before its quota."""
            if route.opa is None:
                return
            document = neutral_input(
                http.method, http.path, headers, route.key_header, (route.api_id, route.tenant_id), identity
            )
            if not route.opa.allows(document):
                raise Deny(Reason.POLICY_DENIED)

        if route.auth_none:
            evaluate(identity_input(None, None, (), None))
            return respond.allow(route.grant, stripped.inbound_identity)
        if route.key_header:
            grant, claims_prefix, sub = self._key_decision(stripped.api_key, route, policy)
            evaluate(identity_input(route.tenant_id, None, (), sub.consumer_id))
            limits = self._quotas.take(route.tenant_id, sub)
            envelope = self._envelope.mint(claims_prefix, rid) if route.envelope else None
            return respond.allow(grant, stripped.inbound_identity, envelope, limits)
        if route.verified_by_envoy:
            decision = self._decided(self._identifier.from_envoy(metadata), route, policy)
        else:
            decision = self._decision(bearer_token(stripped.authorization), route, policy)
        if decision.denial is not None:
            raise Deny(decision.denial)
        assert decision.grant is not None
        if decision.opa_identity is not None:
            evaluate(decision.opa_identity)
        limits = (
            () if decision.subscription is None else self._quotas.take(route.tenant_id, decision.subscription)
        )
        envelope = self._envelope.mint(decision.claims_prefix, rid) if route.envelope else None
        return respond.allow(decision.grant, stripped.inbound_identity, envelope, limits)

    def _key_decision(
        self, key: str | None, route: Route, policy: PolicySet
    ) -> tuple[respond.Grant, str, Subscription]:
        """An API key's consumer and its subscription to the route's API. Not cached: two look-ups.
        A digest is compared through a dictionary of digests of 256-bit random keys, so timing
        tells a caller nothing about any stored key."""
        if not key or len(key) > _MAX_KEY_LENGTH:
            raise Deny(Reason.INVALID_KEY)
        digest = hashlib.sha256(key.encode()).digest()
        owner = policy.keys.get(digest)
        if owner is None or owner[0] != route.tenant_id or digest in self._store.revoked:
            raise Deny(Reason.INVALID_KEY)
        consumer = owner[1]
        sub = subscription(policy, route, consumer)
        return (
            respond.grant(route.tenant_id, route.api_id, consumer=consumer, envelope=route.envelope),
            self._envelope.claims_prefix(
                route.tenant_id,
                route.api_id,
                consumer,
                (),
                consumer=consumer,
                subscription=sub.subscription_id,
            ),
            sub,
        )

    def _decision(self, token: str, route: Route, policy: PolicySet) -> Decision:
        key = (route.route_id, hashlib.sha256(token.encode()).digest())
        cache = policy.decisions
        cached: Decision | None = cache.get(key)
        if cached is not None:
            if self._identifier.clock() <= cached.expires_at + LEEWAY_S:
                return cached
            cache.pop(key, None)
            raise Deny(Reason.EXPIRED_TOKEN)
        identity = self._identifier.identify(token, route)  # Deny for anything not verified: not cached
        decision = self._decided(identity, route, policy)
        if self._config.cache_size:
            cache[key] = decision
            # Other threads evict too: an empty cache here is not an error.
            with contextlib.suppress(KeyError):
                while len(cache) > self._config.cache_size:
                    cache.popitem(last=False)
        return decision

    def _decided(self, identity: Identity, route: Route, policy: PolicySet) -> Decision:
        """The outcome for a verified identity on `route` (with its consumer's subscription when the
        route requires one)."""
        consumer = held = None
        try:
            authorise(identity, route, self._config.required_scopes)
            if route.subscription:
                consumer = policy.clients.get((route.tenant_id, identity.client_id or ""))
                if consumer is None:
                    raise Deny(Reason.NO_SUBSCRIPTION)
                held = subscription(policy, route, consumer)
        except Deny as denial:
            return Decision(identity.expires_at, denial.reason)
        prefix = ""
        if route.envelope:
            prefix = self._envelope.claims_prefix(
                route.tenant_id,
                route.api_id,
                identity.subject,
                identity.scopes,
                consumer,
                held.subscription_id if held else None,
            )
        grant = respond.grant(
            route.tenant_id, route.api_id, identity.subject, consumer, envelope=route.envelope
        )
        opa_identity = None
        if route.opa is not None:
            # The policy sees the token's consumer even where no subscription is required (only it:
            # the grant, and so the upstream's headers, stay those of a route without consumers).
            known = consumer or policy.clients.get((route.tenant_id, identity.client_id or ""))
            opa_identity = identity_input(identity.tenant, identity.subject, identity.scopes, known)
        return Decision(identity.expires_at, None, grant, prefix, held, opa_identity)


def subscription(policy: PolicySet, route: Route, consumer: str) -> Subscription:
    """The consumer's active subscription to the route's API (Deny no_subscription without one)."""
    found = policy.subscriptions.get((route.tenant_id, consumer, route.api_id))
    if found is None or not found.active:
        raise Deny(Reason.NO_SUBSCRIPTION)
    return found


class AuthorizationService(external_auth_pb2_grpc.AuthorizationServicer):
    def __init__(self, decider: Decider) -> None:
        self._decider = decider

    def Check(
        self, request: external_auth_pb2.CheckRequest, context: grpc.ServicerContext
    ) -> external_auth_pb2.CheckResponse:
        return self._decider.decide(request)
