"""The processing policy set: compiled from the Link's ProcPolicySet, kept per version.

A route passes the version it was built with (stream metadata), so an exchange is always processed
with the rules its route was published with, also while a newer set is being rolled out.
"""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import json_format
from stoa_ops.policy_sets import KeptVersions
from stoa_proto import proc_pb2

from stoa_proc.budget import Budget, compile_budget
from stoa_proc.guardrails import Guardrails, PolicyError, compile_guardrails
from stoa_proc.transform import Transform, compile_transform

__all__ = ["PolicyError", "PolicySet", "PolicyStore", "RoutePolicy", "compile_policy_set"]


@dataclass(frozen=True, slots=True)
class RoutePolicy:
    route_id: str
    tenant_id: str
    api_id: str
    guardrails: Guardrails | None
    transform: Transform | None
    token_budget: Budget | None = None


@dataclass(frozen=True, slots=True)
class PolicySet:
    version: str
    routes: dict[str, RoutePolicy]


def compile_policy_set(message: proc_pb2.ProcPolicySet, default_max_body_bytes: int) -> PolicySet:
    if not message.version:
        raise PolicyError("policy set has no version")
    routes: dict[str, RoutePolicy] = {}
    for route in message.routes:
        if not route.route_id or route.route_id in routes:
            raise PolicyError(f"route id {route.route_id!r} is empty or repeated")
        guardrails = None
        if route.HasField("guardrails"):
            g = route.guardrails
            try:
                guardrails = compile_guardrails(
                    g.direction,
                    g.max_body_bytes,
                    g.block_patterns,
                    g.pii.kinds,
                    g.pii.action,
                    json_format.MessageToDict(g.json_schema) if g.HasField("json_schema") else None,
                    default_max_body_bytes,
                )
            except PolicyError as exc:
                raise PolicyError(f"route {route.route_id}: guardrails: {exc}") from exc
        transform = None
        if route.HasField("transform"):
            try:
                transform = compile_transform(route.transform)
            except PolicyError as exc:
                raise PolicyError(f"route {route.route_id}: transform: {exc}") from exc
        token_budget = None
        if route.HasField("token_budget"):
            try:
                token_budget = compile_budget(route.token_budget)
            except PolicyError as exc:
                raise PolicyError(f"route {route.route_id}: token_budget: {exc}") from exc
        routes[route.route_id] = RoutePolicy(
            route.route_id, route.tenant_id, route.api_id, guardrails, transform, token_budget
        )
    return PolicySet(message.version, routes)


class PolicyStore(KeptVersions[PolicySet]):
    """The last few accepted policy sets, by version; an exchange asks for the version its route names."""
