"""The Check: the decision phases in order, one `ext_authz_decision` event per decision, and
fail-closed handling of anything unexpected."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc

from stoa_authz import respond
from stoa_authz.authorise import authorise
from stoa_authz.envelope import Envelope
from stoa_authz.identify import Identifier
from stoa_authz.normalise import normalise
from stoa_authz.policy import PolicyStore
from stoa_authz.reasons import Deny, Reason
from stoa_authz.strip import strip

decision_log = logging.getLogger("stoa_authz.decision")
log = logging.getLogger("stoa_authz.check")


@dataclass(frozen=True, slots=True)
class DecisionConfig:
    audience: str
    required_scopes: frozenset[str]


class Decider:
    def __init__(
        self, config: DecisionConfig, store: PolicyStore, identifier: Identifier, envelope: Envelope
    ) -> None:
        self._config = config
        self._store = store
        self._identifier = identifier
        self._envelope = envelope

    async def decide(self, request: external_auth_pb2.CheckRequest) -> external_auth_pb2.CheckResponse:
        started = time.perf_counter()
        attributes = request.attributes
        ext = attributes.context_extensions
        http = attributes.request.http
        fields = {
            "event": "ext_authz_decision",
            "decision": "deny",
            "reason": Reason.INTERNAL_ERROR.value,
            "tenant": ext.get("tenant_id", ""),
            "api": ext.get("api_id", ""),
            "route": ext.get("route_id", ""),
            "request_id": http.id or http.headers.get("x-request-id", ""),
            "latency_ms": 0.0,
            "policy_set_version": ext.get("policy_set_version", ""),
        }
        try:
            response = await self._phases(request)
            fields["decision"] = "allow"
            fields["reason"] = Reason.ALLOWED.value
        except Deny as denial:
            response = respond.deny(denial.reason)
            fields["reason"] = denial.reason.value
        except Exception:
            # Fail closed; the exception text may quote input, so only its class is logged.
            log.exception("decision failed")
            response = respond.deny(Reason.INTERNAL_ERROR)
        fields["latency_ms"] = round((time.perf_counter() - started) * 1000, 3)
        decision_log.info("ext_authz_decision", extra={"fields": fields})
        return response

    async def _phases(self, request: external_auth_pb2.CheckRequest) -> external_auth_pb2.CheckResponse:
        if not self._config.audience:
            raise Deny(Reason.NOT_CONFIGURED)
        attributes = request.attributes
        ext = attributes.context_extensions
        http = attributes.request.http
        stripped = strip(normalise(http))
        policy = self._store.get(ext.get("policy_set_version", ""))
        if policy is None:
            raise Deny(Reason.POLICY_UNAVAILABLE)
        route = policy.routes.get(ext.get("route_id", ""))
        if route is None or ext.get("tenant_id", route.tenant_id) != route.tenant_id:
            raise Deny(Reason.UNKNOWN_ROUTE)
        if route.auth_none:
            return respond.allow(route.tenant_id, route.api_id, stripped.inbound_identity)
        identity = await self._identifier.identify(stripped.authorization, route, policy)
        authorise(identity, route, self._config.required_scopes)
        envelope = self._envelope.mint(
            route.tenant_id, route.api_id, identity.subject, identity.scopes, http.id
        )
        return respond.allow(
            route.tenant_id, route.api_id, stripped.inbound_identity, identity.subject, envelope
        )


class AuthorizationService(external_auth_pb2_grpc.AuthorizationServicer):
    def __init__(self, decider: Decider) -> None:
        self._decider = decider

    async def Check(
        self, request: external_auth_pb2.CheckRequest, context: grpc.aio.ServicerContext
    ) -> external_auth_pb2.CheckResponse:
        return await self._decider.decide(request)
