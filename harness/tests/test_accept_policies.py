"""The policies a user attaches (cors, rate_limit, ip_filter) and where they reach,
through a real Envoy fed by the real CP and Link, with the Check witness allowing everything.

One estate for the module; every policy and route of the behaviour tests is published up front, in as
few waits as possible. The scope test adds a second gateway (its own Link, Envoy and witness) on the
same CP, so a gateway-scoped policy there cannot collide with the policies of `gw-1`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from stoa_harness.estate import Estate
from stoa_harness.site import Site
from stoa_harness.wait import wait_until
from stoa_link.agent import InventoryStore
from stoa_proto import inventory_pb2
from stoa_proto.bodies import CONTENT_TYPE, DENY_BODIES

TENANT = "pol"
ORIGIN = "https://app.example.com"
SUBDOMAIN_ORIGIN = "https://shop.eu.trusted.example"
FOREIGN_ORIGIN = "https://evil.example.net"
CORS_CONFIG: dict[str, Any] = {
    "allowedOrigins": [ORIGIN, "https://*.trusted.example"],
    "allowedMethods": ["GET", "POST"],
    "allowedHeaders": ["content-type", "x-request-tag"],
    "exposeHeaders": ["x-trace-id", "x-upstream-region"],
    "maxAge": 600,
    "allowCredentials": True,
}
API_IDS = (
    "p-cors",
    "p-rate",
    "p-rate-authz",
    "p-deny-local",
    "p-allow-local",
    "p-allow-other",
    "p-deny-other",
)
RATE_MAX = 3
# Envoy refills one token every RATE_INTERVAL_S / RATE_MAX seconds: the burst of RATE_MAX + 1 requests
# must fit in that step (1 s leaves room on a loaded machine), and the test waits about that long.
RATE_INTERVAL_S = 3


@pytest.fixture(scope="module")
def policies(estate: Estate) -> Estate:
    """Routes and their policies on gw-1, all published before the first wait."""
    up = estate.upstream
    for api_id in API_IDS:
        estate.publish(api_id, tenant_id=TENANT, upstream_url=f"{up.url}/{api_id}", methods=["GET", "POST"])
    ip_rules = {
        "p-deny-local": ("deny", ["127.0.0.1"]),
        "p-allow-local": ("allow", ["127.0.0.0/8"]),
        "p-allow-other": ("allow", ["10.0.0.0/8", "2001:db8::/32"]),
        "p-deny-other": ("deny", ["10.0.0.0/8", "::1"]),
    }
    # (policy id, type, config, the API it targets)
    rules = [
        ("cors-app", "cors", CORS_CONFIG, "p-cors"),
        ("rate-3", "rate_limit", {"maxRequests": RATE_MAX, "intervalSeconds": RATE_INTERVAL_S}, "p-rate"),
        # A bucket that never refills during the test: only what was authorized can have spent it.
        ("rate-2-hour", "rate_limit", {"maxRequests": 2, "intervalSeconds": 3600}, "p-rate-authz"),
        *(
            (f"ip-{api_id}", "ip_filter", {"mode": mode, "ip_list": ip_list}, api_id)
            for api_id, (mode, ip_list) in ip_rules.items()
        ),
    ]
    for policy_id, policy_type, config, api_id in rules:
        estate.admin.add_policy(policy_id, policy_type, config, tenant_id=TENANT, targets=[api_id])
    estate.admin.wait_synced()
    return estate


pytestmark = pytest.mark.usefixtures("fresh_records")


def cors_headers(response: httpx.Response) -> dict[str, str]:
    return {k.lower(): v for k, v in response.headers.items() if k.lower().startswith("access-control-")}


# -- CORS ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("origin", [ORIGIN, SUBDOMAIN_ORIGIN])
def test_an_allowed_origin_preflight_gets_the_contract_headers_from_envoy(
    policies: Estate, origin: str
) -> None:
    response = policies.gateway.options(
        policies.url("/apis/p-cors/orders"),
        headers={
            "origin": origin,
            "access-control-request-method": "POST",
            "access-control-request-headers": "content-type",
        },
    )

    assert response.status_code == 200
    headers = cors_headers(response)
    assert headers["access-control-allow-origin"] == origin
    assert headers["access-control-allow-methods"] == "GET,POST"
    assert headers["access-control-allow-headers"] == "content-type,x-request-tag"
    assert headers["access-control-max-age"] == "600"
    assert headers["access-control-allow-credentials"] == "true"
    # Answered by Envoy itself: neither the authorization hop nor the upstream saw it.
    assert policies.witness.checks() == []
    assert policies.upstream.arrivals() == []


@pytest.mark.parametrize(
    "origin", [FOREIGN_ORIGIN, "https://trusted.example", "https://evil-trusted.example"]
)
def test_a_foreign_origin_gets_no_cors_headers(policies: Estate, origin: str) -> None:
    preflight = policies.gateway.options(
        policies.url("/apis/p-cors/orders"),
        headers={"origin": origin, "access-control-request-method": "POST"},
    )
    actual = policies.gateway.get(policies.url("/apis/p-cors/orders"), headers={"origin": origin})

    assert cors_headers(preflight) == {}
    assert actual.status_code == 200
    assert cors_headers(actual) == {}
    # Not a preflight Envoy answers: it went through authorization like any request.
    assert [c.method for c in policies.witness.checks()] == ["OPTIONS", "GET"]


def test_an_actual_request_from_an_allowed_origin_carries_the_exposed_headers(policies: Estate) -> None:
    policies.upstream.reply_with(headers={"x-trace-id": "t-1", "x-upstream-region": "eu"})

    response = policies.gateway.post(
        policies.url("/apis/p-cors/orders"), headers={"origin": ORIGIN}, content=b"{}"
    )

    assert response.status_code == 200
    headers = cors_headers(response)
    assert headers["access-control-allow-origin"] == ORIGIN
    assert headers["access-control-allow-credentials"] == "true"
    assert headers["access-control-expose-headers"] == "x-trace-id,x-upstream-region"
    assert response.headers["x-trace-id"] == "t-1"
    [arrival] = policies.upstream.arrivals()
    assert (arrival.method, arrival.path) == ("POST", "/p-cors/orders")


def test_a_route_without_a_cors_policy_gets_no_cors_headers(policies: Estate) -> None:
    response = policies.gateway.get(policies.url("/apis/p-allow-local/x"), headers={"origin": ORIGIN})
    assert response.status_code == 200
    assert cors_headers(response) == {}
    # No OPTIONS entry on a method-constrained route without a cors policy.
    preflight = policies.gateway.options(
        policies.url("/apis/p-allow-local/x"),
        headers={"origin": ORIGIN, "access-control-request-method": "GET"},
    )
    assert preflight.status_code == 404


# -- token bucket -------------------------------------------------------------------------------
def test_request_n_plus_one_in_an_interval_gets_429_then_passes_after_the_interval(policies: Estate) -> None:
    url = policies.url("/apis/p-rate/x")

    started = time.monotonic()
    burst = [policies.gateway.get(url) for _ in range(RATE_MAX + 1)]
    limited_at = time.monotonic()
    # The burst must fit in one refill step for "within one interval" to mean anything.
    assert limited_at - started < RATE_INTERVAL_S / RATE_MAX

    assert [r.status_code for r in burst] == [200] * RATE_MAX + [429]
    retry_after = burst[-1].headers.get("retry-after")
    assert retry_after is not None
    assert retry_after.isdigit()
    assert 1 <= int(retry_after) <= RATE_INTERVAL_S
    assert len(policies.upstream.arrivals("/p-rate/")) == RATE_MAX

    passed = wait_until(
        lambda: policies.gateway.get(url).status_code == 200, RATE_INTERVAL_S + 3, "a request passing again"
    )
    assert passed
    assert len(policies.upstream.arrivals("/p-rate/")) == RATE_MAX + 1


def test_the_bucket_counts_only_authorized_requests(policies: Estate) -> None:
    url = policies.url("/apis/p-rate-authz/x")
    policies.witness.deny()
    denied = [policies.gateway.get(url).status_code for _ in range(5)]
    policies.witness.allow()
    allowed = [policies.gateway.get(url).status_code for _ in range(3)]

    assert denied == [403] * 5
    assert allowed == [200, 200, 429]
    assert len(policies.upstream.arrivals("/p-rate-authz/")) == 2


# -- address filter -----------------------------------------------------------------------------
FORGED = [
    {},
    {"x-forwarded-for": "10.1.2.3"},
    {"x-forwarded-for": "203.0.113.9, 10.1.2.3"},
    {"x-real-ip": "10.1.2.3", "forwarded": "for=10.1.2.3"},
]


@pytest.mark.parametrize(
    ("api_id", "expected"),
    [("p-deny-local", 403), ("p-allow-local", 200), ("p-allow-other", 403), ("p-deny-other", 200)],
)
def test_ip_filter_acts_on_the_peer_address_and_forged_forwarding_changes_nothing(
    policies: Estate, api_id: str, expected: int
) -> None:
    codes = [
        policies.gateway.get(policies.url(f"/apis/{api_id}/x"), headers=headers).status_code
        for headers in FORGED
    ]

    assert codes == [expected] * len(FORGED)
    routed = policies.upstream.arrivals(f"/{api_id}/")
    assert len(routed) == (len(FORGED) if expected == 200 else 0)


def test_an_address_denial_has_the_neutral_body_and_an_authz_denial_keeps_its_own(policies: Estate) -> None:
    refused = policies.gateway.get(policies.url("/apis/p-deny-local/x"))
    assert refused.status_code == 403
    assert refused.content == DENY_BODIES[403]  # never Envoy's text naming the filter
    assert refused.headers["content-type"] == CONTENT_TYPE

    own_body = b'{"error":"witness-says-no"}'
    policies.witness.deny(403, own_body)
    try:
        denied = policies.gateway.get(policies.url("/apis/p-deny-other/x"))
    finally:
        policies.witness.allow()
    assert denied.status_code == 403
    assert denied.content == own_body


# -- scope expansion ----------------------------------------------------------------------------
GW2 = "gw-2"


def applied_inventory(site: Site) -> inventory_pb2.Inventory:
    """What the Link received, accepted and had Envoy acknowledge (its persisted last applied state)."""
    applied = InventoryStore(Path(site.link_env["STOA_LINK_STATE_DIR"])).load()
    assert applied is not None
    return applied


def applicable(inventory: inventory_pb2.Inventory) -> dict[str, list[str]]:
    return {p.policy_id: sorted(p.applicable) for p in inventory.policies}


@pytest.fixture(scope="module")
def second_gateway(
    policies: Estate, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Site, Estate]]:
    """gw-2 on the same CP with its own Link, Envoy and witness; scoped policies of three kinds."""
    estate = policies
    created = estate.admin.create_gateway(GW2, "Second")
    up = estate.upstream
    for tenant in ("scope-a", "scope-b"):
        estate.admin.create_tenant(tenant, exist_ok=True)
    for api_id, tenant in (("sa-1", "scope-a"), ("sa-2", "scope-a"), ("sb-1", "scope-b")):
        estate.create_api(api_id, tenant_id=tenant, upstream_url=f"{up.url}/{api_id}", methods=["GET"])
        estate.admin.deploy(api_id, gateway_id=GW2)
    estate.admin.deploy("sa-1")  # scope-a also has a route on gw-1
    estate.admin.add_policy(
        "sa-cors", "cors", {"allowedOrigins": [ORIGIN]}, tenant_id="scope-a", scope="tenant"
    )
    rate = {"maxRequests": 100000, "intervalSeconds": 1}
    estate.admin.add_policy("gw2-rate", "rate_limit", rate, tenant_id=None, gateway_id=GW2)
    # An API binding without targets: were it broadened, it would deny every request from here.
    estate.admin.add_policy(
        "sb-none", "ip_filter", {"mode": "deny", "ip_list": ["127.0.0.0/8"]}, tenant_id="scope-b", targets=[]
    )
    with Site(
        run_dir=tmp_path_factory.mktemp("site-gw2"),
        cp_url=estate.cp_url,
        gateway_id=GW2,
        credential=created["credential"],
    ) as site:
        estate.admin.wait_synced(gateway_id=GW2)
        estate.admin.wait_synced()
        yield site, estate


def test_scopes_expand_onto_the_right_routes_in_the_inventory_the_link_applied(
    second_gateway: tuple[Site, Estate],
) -> None:
    site, estate = second_gateway
    assert estate.site is not None
    on_gw2 = applied_inventory(site)
    on_gw1 = applied_inventory(estate.site)

    assert on_gw2.gateway_id == GW2
    assert sorted(r.route_id for r in on_gw2.routes) == ["sa-1", "sa-2", "sb-1"]
    gw2 = applicable(on_gw2)
    assert gw2["sa-cors"] == ["sa-1", "sa-2"]  # tenant scope: that tenant's routes only
    assert gw2["gw2-rate"] == ["sa-1", "sa-2", "sb-1"]  # gateway scope: every route of the gateway
    assert gw2.get("sb-none", []) == []  # api scope without targets: none
    scopes = {p.policy_id: p.scope for p in on_gw2.policies}
    assert scopes["sa-cors"] == "tenant"
    assert scopes["gw2-rate"] == "gateway"

    gw1 = applicable(on_gw1)
    assert gw1["sa-cors"] == ["sa-1"]  # the same tenant policy, expanded per gateway
    assert "gw2-rate" not in gw1  # another gateway's policy never reaches gw-1
    assert gw1.get("sb-none", []) == []


def test_scopes_expand_onto_the_right_routes_through_envoy(second_gateway: tuple[Site, Estate]) -> None:
    site, estate = second_gateway
    preflight = {"origin": ORIGIN, "access-control-request-method": "GET"}

    def gw2(api_id: str, method: str = "GET") -> httpx.Response:
        return estate.gateway.request(method, f"{site.gateway_url}/apis/{api_id}/x", headers=preflight)

    for api_id in ("sa-1", "sa-2"):
        answered = gw2(api_id, "OPTIONS")
        assert answered.status_code == 200, api_id
        assert answered.headers.get("access-control-allow-origin") == ORIGIN, api_id
    other_tenant = gw2("sb-1", "OPTIONS")
    assert other_tenant.status_code == 404  # no cors policy, so no OPTIONS on a GET-only route
    assert cors_headers(other_tenant) == {}

    for api_id in ("sa-1", "sa-2", "sb-1"):
        served = gw2(api_id)
        assert served.status_code == 200, api_id  # sb-1: the target-less deny reached nothing
        assert served.headers.get("x-ratelimit-limit") == "100000", api_id

    on_gw1 = estate.gateway.get(estate.url("/apis/sa-1/x"), headers={"origin": ORIGIN})
    assert on_gw1.status_code == 200
    assert on_gw1.headers.get("access-control-allow-origin") == ORIGIN
    assert "x-ratelimit-limit" not in on_gw1.headers


def test_the_preview_is_what_the_link_publishes(policies: Estate) -> None:
    # The CP runs the Link's translator with the settings the Link reported (this estate's ports
    # are not the defaults): the same snapshot, so the same content hash the Link reported SYNCED.
    status = policies.admin.wait_synced()
    preview = policies.admin.preview(validate=True)
    assert preview["settings_reported"] is True
    assert preview["refusal"] is None
    assert preview["generation"] == status["acknowledged_generation"]
    assert preview["snapshot_version"] == status["snapshot_version"]
    assert preview["validation"] == {"valid": True, "detail": ""}
    # And what Envoy holds is what the preview shows.
    (previewed,) = preview["resources"]["type.googleapis.com/envoy.config.route.v3.RouteConfiguration"]
    (held,) = policies.envoy.config_dump("dynamic_route_configs")["configs"]
    names = [[r["name"] for r in host["routes"]] for host in held["route_config"]["virtual_hosts"]]
    assert names == [[r["name"] for r in host["routes"]] for host in previewed["virtual_hosts"]]
