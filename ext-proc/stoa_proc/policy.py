"""The processing policy set: compiled from the Link's ProcPolicySet, kept per version.

A route passes the version it was built with (stream metadata), so an exchange is always processed
with the rules its route was published with, also while a newer set is being rolled out.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from stoa_ops.policy_sets import KeptVersions
from stoa_proto import proc_pb2

from stoa_proc.budget import Budget, compile_budget
from stoa_proc.guardrails import Guardrails, compile_guardrails
from stoa_proc.rules import PolicyError
from stoa_proc.transform import Transform, compile_transform

T = TypeVar("T")

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
        guardrails = _compiled(route, "guardrails", lambda g: compile_guardrails(g, default_max_body_bytes))
        transform = _compiled(route, "transform", compile_transform)
        token_budget = _compiled(route, "token_budget", compile_budget)
        routes[route.route_id] = RoutePolicy(
            route.route_id, route.tenant_id, route.api_id, guardrails, transform, token_budget
        )
    return PolicySet(message.version, routes)


def _compiled(route: proc_pb2.ProcRoute, kind: str, compile_rules: Callable[[Any], T]) -> T | None:
    """The route's rules of one kind compiled (None when it has none); a refusal names route and kind."""
    if not route.HasField(kind):
        return None
    try:
        return compile_rules(getattr(route, kind))
    except PolicyError as exc:
        raise PolicyError(f"route {route.route_id}: {kind}: {exc}") from exc


class PolicyStore(KeptVersions[PolicySet]):
    """The last few accepted policy sets, by version; an exchange asks for the version its route names."""
