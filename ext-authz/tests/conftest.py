"""Shared builders for the authorization service's unit tests."""

from __future__ import annotations

import json

import pytest
from envoy.service.auth.v3 import external_auth_pb2
from stoa_harness.idp import DevIdentityProvider
from stoa_proto import authz_pb2, inventory_pb2
from stoa_translate.policy_set import route_version

AUDIENCE = "stoa-test"


def check_request(
    headers: dict[str, str] | None = None,
    route_id: str = "orders",
    version: str | None = None,
    tenant_id: str = "acme",
    api_id: str = "orders",
    request_id: str = "req-1",
    path: str | None = None,
) -> external_auth_pb2.CheckRequest:
    """The Check Envoy sends on route `route_id`; `version` is the route's entry version (by default
    the one of the route of that id in `policy_message`'s or `verified_policy_message`'s set)."""
    request = external_auth_pb2.CheckRequest()
    attributes = request.attributes
    if version is None:
        version = route_version(ROUTES[route_id]) if route_id in ROUTES else ""
    attributes.context_extensions.update(
        {"tenant_id": tenant_id, "api_id": api_id, "route_id": route_id, "route_version": version}
    )
    http = attributes.request.http
    http.id = request_id
    http.method = "GET"
    http.path = path or f"/apis/{api_id}"
    http.headers.update({":authority": "gw.local", ":path": http.path, ":method": "GET", **(headers or {})})
    return request


def orders_read_route(route_id: str, **options: bool) -> authz_pb2.AuthzRoute:
    """A jwt route of tenant acme named `route_id` (its API too) that needs the scope orders:read."""
    return authz_pb2.AuthzRoute(
        route_id=route_id,
        tenant_id="acme",
        api_id=route_id,
        auth_mode="jwt",
        scopes=["orders:read"],
        **options,
    )


# The routes of the sets below, by id.
ROUTES = {
    "orders": orders_read_route("orders", envelope=True),
    "open": authz_pb2.AuthzRoute(route_id="open", tenant_id="acme", api_id="open", auth_mode="none"),
    "verified": orders_read_route("verified", verified_by_envoy=True),
}


def policy_message(idp: DevIdentityProvider, version: str = "v1") -> authz_pb2.AuthzPolicySet:
    """Tenant acme: a jwt route `orders` (scope orders:read, with the envelope) and an auth-none
    route `open`."""
    return authz_pb2.AuthzPolicySet(
        name="default",
        version=version,
        gateway_id="gw-1",
        routes=[ROUTES["orders"], ROUTES["open"]],
        issuers=[
            inventory_pb2.TrustedIssuer(tenant_id="acme", issuer=idp.issuer, jwks_json=json.dumps(idp.jwks()))
        ],
    )


def verified_policy_message(idp: DevIdentityProvider, version: str = "v1") -> authz_pb2.AuthzPolicySet:
    """`policy_message`'s set plus `verified`: orders' rules, the token verified by Envoy, no envelope."""
    message = policy_message(idp, version)
    message.routes.append(ROUTES["verified"])
    return message


@pytest.fixture(scope="session")
def idp() -> DevIdentityProvider:
    # Not started: tokens and JWKS come from its methods; its issuer is its (unbound) base URL.
    return DevIdentityProvider(alg="RS256", audience=AUDIENCE)


@pytest.fixture(scope="session")
def req():
    return check_request


@pytest.fixture(scope="session")
def policy():
    return policy_message


@pytest.fixture(scope="session")
def audience() -> str:
    return AUDIENCE


@pytest.fixture(scope="session")
def verified_policy():
    return verified_policy_message
