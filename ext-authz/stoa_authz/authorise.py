"""Phase 4, authorise: the token's tenant is the route's tenant, and it holds every scope the
route and the service require."""

from __future__ import annotations

from stoa_authz.identify import Identity
from stoa_authz.policy import Route
from stoa_authz.reasons import Deny, Reason


def authorise(identity: Identity, route: Route, required_scopes: frozenset[str]) -> None:
    if identity.tenant != route.tenant_id:
        raise Deny(Reason.TENANT_MISMATCH)
    if not (route.scopes <= identity.scopes and required_scopes <= identity.scopes):
        raise Deny(Reason.INSUFFICIENT_SCOPE)
