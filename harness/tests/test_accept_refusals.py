"""What a site cannot express safely — an unsupported policy type, two rules of one type on one route —
is refused by the CP at the write (422, 409 naming the other policy), by the same rules the Link
applies: nothing is stored, the gateway stays SYNCED, Envoy keeps exactly the configuration it had
(versions from its admin interface). What has a normal form (`get` → `GET`) is published in it.
The Link's own refusals of such inventories (an older or newer CP) are in translator/tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from stoa_harness.cp_client import CPError
from stoa_harness.estate import Estate
from stoa_harness.wait import wait_until

TENANT = "ref"
LIVE = "/apis/ref-live/x"


@pytest.fixture(scope="module")
def refusals(estate: Estate) -> Estate:
    up = estate.upstream
    estate.publish("ref-live", tenant_id=TENANT, upstream_url=f"{up.url}/live", methods=["GET"])
    # A policy of every supported type already on the route: a duplicate of each is a refusal.
    for policy_id, policy_type, config in (
        ("ref-cors", "cors", {"allowedOrigins": ["https://app.example.com"]}),
        ("ref-rate", "rate_limit", {"maxRequests": 100000, "intervalSeconds": 1}),
        ("ref-ip", "ip_filter", {"mode": "allow", "ip_list": ["127.0.0.0/8"]}),
    ):
        estate.admin.add_policy(policy_id, policy_type, config, tenant_id=TENANT, targets=["ref-live"])
    estate.admin.wait_synced()
    wait_serving(estate)
    return estate


def wait_serving(estate: Estate) -> None:
    """The live route answers 200 through Envoy and its Check. Waited on rather than asked once: each
    Envoy worker opens its own connection to the Check service on its first request, and on a loaded
    machine that first Check may miss the 250 ms ext_authz deadline (a 503 that says nothing about the
    configuration). A route a refused change had broken would stay broken past the deadline."""
    wait_until(
        lambda: estate.gateway.get(estate.url(LIVE)).status_code == 200, 15, f"{LIVE} serving through Envoy"
    )


class Baseline:
    """What Envoy and the gateway held before a refused change."""

    def __init__(self, estate: Estate) -> None:
        self.envoy_versions = estate.envoy.versions()
        self.status = estate.admin.status()
        assert self.status["state"] == "SYNCED"
        assert set(self.envoy_versions) == {"cds", "lds", "rds"}


@pytest.fixture
def baseline(refusals: Estate, witness_allows: None) -> Iterator[Baseline]:
    before = Baseline(refusals)
    yield before
    # Whatever a test refused, the gateway must come back to SYNCED once it is removed.
    refusals.admin.wait_synced()


def assert_envoy_unchanged(estate: Estate, before: Baseline) -> None:
    assert estate.envoy.versions() == before.envoy_versions
    wait_serving(estate)


UNSUPPORTED: list[tuple[str, dict[str, Any]]] = [
    ("jwt_validation", {"issuer": "https://idp.example.com", "audience": "api"}),
    ("logging", {"level": "debug"}),
    ("caching", {"ttlSeconds": 60}),
    ("waf", {"mode": "block"}),
    ("oidc", {"clientId": "web"}),
    ("geo_fence", {"countries": ["FR"]}),
]


def assert_nothing_changed(estate: Estate, before: Baseline) -> None:
    """The refused write left the gateway as it was: same generation, still SYNCED, Envoy untouched."""
    status = estate.admin.status()
    assert status["state"] == "SYNCED"
    assert status["desired_generation"] == before.status["desired_generation"]
    assert_envoy_unchanged(estate, before)


@pytest.mark.parametrize(("policy_type", "config"), UNSUPPORTED, ids=[t for t, _ in UNSUPPORTED])
def test_an_unsupported_policy_type_is_refused_at_the_cp(
    refusals: Estate, baseline: Baseline, policy_type: str, config: dict[str, Any]
) -> None:
    # The CP learns the site's rules from the translator itself: it refuses what the Link would.
    policy_id = f"bad-{policy_type.replace('_', '-')}"
    with pytest.raises(CPError) as refused:
        refusals.admin.add_policy(policy_id, policy_type, config, tenant_id=TENANT, targets=["ref-live"])
    assert refused.value.status_code == 422
    assert refused.value.fields == ["type"]
    assert "supported: cors, rate_limit, ip_filter" in refused.value.problem["errors"][0]["message"]
    assert_nothing_changed(refusals, baseline)


DUPLICATES: list[tuple[str, str, dict[str, Any]]] = [
    ("dup-cors", "cors", {"allowedOrigins": ["https://other.example.com"]}),
    ("dup-rate", "rate_limit", {"maxRequests": 5, "intervalSeconds": 60}),
    ("dup-ip", "ip_filter", {"mode": "deny", "ip_list": ["10.0.0.0/8"]}),
]


@pytest.mark.parametrize(("policy_id", "policy_type", "config"), DUPLICATES, ids=[d[1] for d in DUPLICATES])
@pytest.mark.parametrize("scope", ["api", "tenant", "gateway"])
def test_two_rules_of_one_type_on_one_route_are_refused_at_the_cp(
    refusals: Estate, baseline: Baseline, policy_id: str, policy_type: str, config: dict[str, Any], scope: str
) -> None:
    placement: dict[str, Any] = (
        {"tenant_id": None}
        if scope == "gateway"
        else {"tenant_id": TENANT, "scope": scope, "targets": ["ref-live"] if scope == "api" else []}
    )
    with pytest.raises(CPError) as refused:
        refusals.admin.add_policy(policy_id, policy_type, config, **placement)
    assert refused.value.status_code == 409
    message = refused.value.problem["errors"][0]["message"]
    # The rule it collides with, by id, and the route.
    assert message.startswith(f"policy ref-{policy_type.split('_')[0]} of type {policy_type}")
    assert "ref-live" in message
    assert_nothing_changed(refusals, baseline)


def test_lower_case_cors_methods_are_published_in_normal_form(refusals: Estate, baseline: Baseline) -> None:
    # Once 201 then FAILED (the Link refused "get"): the CP now stores and publishes "GET".
    api_id = "ref-lower"
    upstream = f"{refusals.upstream.url}/lower"
    refusals.create_api(api_id, tenant_id=TENANT, upstream_url=upstream, methods=["GET"])
    config = {"allowedOrigins": ["https://app.example.com"], "allowedMethods": ["get"]}
    stored = refusals.admin.create_policy(
        "ref-lower-cors", "cors", config, tenant_id=TENANT, targets=[api_id]
    )
    assert stored["config"]["allowedMethods"] == ["GET"]
    refusals.admin.wait_synced(refusals.admin.deploy(api_id))
    try:
        preflight = refusals.gateway.options(
            refusals.url(f"/apis/{api_id}/x"),
            headers={"origin": "https://app.example.com", "access-control-request-method": "GET"},
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-methods"] == "GET"
    finally:
        refusals.admin.undeploy(api_id)
