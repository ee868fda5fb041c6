"""Placement: each route's decision at the cheapest place that enforces it exactly.

- `ENVOY`: the whole decision in Envoy's built-in filters, no Check — the token by `jwt_authn` (the
  tenant's issuers' keys inline, the site's audience), tenant and scopes by `rbac` on the verified
  payload, identity headers added by the route. For a route whose every rule is expressible there:
  a JWT route of a tenant whose issuers all ship their keys inline, or a route without a token.
- `SERVICE_VERIFIED_TOKEN`: `jwt_authn` verifies the token, the authorization service decides the
  rest on its verified payload (a route with the identity envelope, which only the service signs, or
  one whose token's consumer needs a subscription, which only the service knows).
- `SERVICE`: the authorization service decides everything (an API-key route; a tenant with an issuer
  known only by its `jwks_uri`, whose keys the service may fetch; every route when the site says
  `service`).

Without the site's audience no route is decided by Envoy: the service then denies every request
(`not_configured`), as it always has.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from envoy.config.route.v3 import route_components_pb2

from stoa_translate import jwks

if TYPE_CHECKING:
    from stoa_translate.ir import IssuerIR, RouteIR, SiteIR
    from stoa_translate.options import TranslateOptions

ENVOY = "envoy"
SERVICE_VERIFIED_TOKEN = "service_verified_token"
SERVICE = "service"
# Routes on which jwt_authn verifies the token.
TOKEN_BY_ENVOY = (ENVOY, SERVICE_VERIFIED_TOKEN)
# ext_authz's entry on a route Envoy decides: the filter is left out of the route's chain. Its own
# `ExtAuthzPerRoute{disabled}` would have Envoy create it for every request and then skip it, ~14,000
# instructions, a tenth of what the native decision costs (bench/PROFILE-native.md).
NO_CHECK = route_components_pb2.FilterConfig(disabled=True)


def verifiable_tenants(issuers: Iterable[IssuerIR]) -> frozenset[str]:
    """Tenants whose tokens Envoy can verify on its own: every issuer ships its keys inline."""
    inline: dict[str, bool] = {}
    for issuer in issuers:
        inline[issuer.tenant_id] = inline.get(issuer.tenant_id, True) and bool(issuer.jwks_json)
    return frozenset(tenant for tenant, ok in inline.items() if ok)


def envoy_verifies(options: TranslateOptions) -> bool:
    """Whether Envoy verifies any token on this site (it needs the site's audience)."""
    return options.decision_placement != "service" and bool(options.audience)


def envoy_verified_tenants(site: SiteIR, options: TranslateOptions) -> frozenset[str]:
    """The tenants whose tokens jwt_authn verifies on a route that names them, whether or not such a
    route exists yet (the listener holds their issuers from the first publication on)."""
    return verifiable_tenants(site.issuers) if envoy_verifies(options) else frozenset()


def place(route: RouteIR, verifiable: frozenset[str], options: TranslateOptions) -> str:
    if not envoy_verifies(options):
        return SERVICE
    # Keys, consumers, subscriptions and OPA policies are only known to the service.
    by_service = route.policy("opa") is not None
    if route.auth_mode == "none":
        return SERVICE if by_service else ENVOY
    if route.key_header or route.tenant_id not in verifiable:
        return SERVICE
    return SERVICE_VERIFIED_TOKEN if by_service or route.envelope or route.subscription else ENVOY


# A tenant's issuers as a route whose token jwt_authn verified checks them again: (iss, the key ids
# of its key set now; empty when a key has none, so any key id or none).
Trust = tuple[tuple[str, tuple[str, ...]], ...]


def trust_by_tenant(issuers: Iterable[IssuerIR]) -> dict[str, Trust]:
    found: dict[str, list[tuple[str, tuple[str, ...]]]] = {}
    for issuer in issuers:
        found.setdefault(issuer.tenant_id, []).append((issuer.issuer, jwks.key_ids(issuer.jwks_json)))
    return {tenant: tuple(sorted(entries)) for tenant, entries in found.items()}


def placed_route(
    route: RouteIR, verifiable: frozenset[str], trust: Mapping[str, Trust], options: TranslateOptions
) -> RouteIR:
    """The route with its placement set and, when jwt_authn verifies its token, its tenant's issuers
    and keys as they are now (the same object when neither changes)."""
    where = place(route, verifiable, options)
    verified = where in TOKEN_BY_ENVOY and route.auth_mode == "jwt"
    trusted = trust.get(route.tenant_id, ()) if verified else ()
    if where == route.placement and trusted == route.trust:
        return route
    return dataclasses.replace(route, placement=where, trust=trusted)


def placed(site: SiteIR, options: TranslateOptions) -> SiteIR:
    """`site` with each route placed (`placed_route`)."""
    verifiable = verifiable_tenants(site.issuers)
    trust = trust_by_tenant(site.issuers)
    routes = tuple(placed_route(route, verifiable, trust, options) for route in site.routes)
    return dataclasses.replace(site, routes=routes)
