"""Issue 3 acceptance: what the Link cannot express safely is refused whole — an unsupported policy type,
or two rules of one type on one route — reported FAILED with the policy named, and Envoy keeps exactly
the configuration it had (versions from its admin interface), still serving the old routes.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from stoa_harness.estate import Estate
from stoa_harness.wait import wait_until

TENANT = "ref"
LIVE = "/apis/ref-live/x"


@pytest.fixture(scope="module")
def refusals(estate: Estate) -> Estate:
    up = estate.upstream
    estate.publish("ref-live", tenant_id=TENANT, upstream_url=f"{up.url}/live", methods=["GET"])
    # A policy of every supported type already on the route: a duplicate of each is a refusal.
    estate.admin.add_policy(
        "ref-cors",
        "cors",
        {"allowedOrigins": ["https://app.example.com"]},
        tenant_id=TENANT,
        targets=["ref-live"],
    )
    estate.admin.add_policy(
        "ref-rate",
        "rate_limit",
        {"maxRequests": 100000, "intervalSeconds": 1},
        tenant_id=TENANT,
        targets=["ref-live"],
    )
    estate.admin.add_policy(
        "ref-ip",
        "ip_filter",
        {"mode": "allow", "ip_list": ["127.0.0.0/8"]},
        tenant_id=TENANT,
        targets=["ref-live"],
    )
    estate.admin.wait_synced()
    assert estate.gateway.get(estate.url(LIVE)).status_code == 200
    return estate


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


def wait_failed(estate: Estate, generation: int) -> dict[str, Any]:
    def failed() -> dict[str, Any] | None:
        status = estate.admin.status()
        report = status.get("last_report") or {}
        if int(report.get("generation") or 0) == generation and report.get("status") == "FAILED":
            return status
        assert not (status["state"] == "SYNCED" and int(status["acknowledged_generation"]) >= generation), (
            f"generation {generation} was applied: {status}"
        )
        return None

    return wait_until(failed, 30, f"generation {generation} reported FAILED")


def assert_envoy_unchanged(estate: Estate, before: Baseline) -> None:
    assert estate.envoy.versions() == before.envoy_versions
    assert estate.gateway.get(estate.url(LIVE)).status_code == 200


UNSUPPORTED: list[tuple[str, dict[str, Any]]] = [
    ("jwt_validation", {"issuer": "https://idp.example.com", "audience": "api"}),
    ("logging", {"level": "debug"}),
    ("caching", {"ttlSeconds": 60}),
    ("transform", {"addHeaders": {"x-a": "b"}}),
    ("oidc", {"clientId": "web"}),
    ("geo_fence", {"countries": ["FR"]}),
]


@pytest.mark.parametrize(("policy_type", "config"), UNSUPPORTED, ids=[t for t, _ in UNSUPPORTED])
def test_an_unsupported_policy_type_is_refused_whole(
    refusals: Estate, baseline: Baseline, policy_type: str, config: dict[str, Any]
) -> None:
    policy_id = f"bad-{policy_type.replace('_', '-')}"
    refusals.admin.add_policy(policy_id, policy_type, config, tenant_id=TENANT, targets=["ref-live"])
    # A route published in the same refused state must not appear either: nothing of it is published.
    refusals.create_api(f"ref-new-{policy_id}", tenant_id=TENANT, upstream_url=f"{refusals.upstream.url}/new")
    generation = refusals.admin.deploy(f"ref-new-{policy_id}")
    try:
        status = wait_failed(refusals, generation)

        report = status["last_report"]
        assert status["state"] == "FAILED"
        assert report["reason"] == "UNSUPPORTED_POLICY"
        assert policy_id in report["detail"]
        assert policy_type in report["detail"]
        assert_envoy_unchanged(refusals, baseline)
        assert refusals.gateway.get(refusals.url(f"/apis/ref-new-{policy_id}/x")).status_code == 404
    finally:
        refusals.admin.delete_policy(policy_id, tenant_id=TENANT)
    refusals.admin.wait_synced()
    assert refusals.gateway.get(refusals.url(f"/apis/ref-new-{policy_id}/x")).status_code == 200


DUPLICATES: list[tuple[str, str, dict[str, Any]]] = [
    ("dup-cors", "cors", {"allowedOrigins": ["https://other.example.com"]}),
    ("dup-rate", "rate_limit", {"maxRequests": 5, "intervalSeconds": 60}),
    ("dup-ip", "ip_filter", {"mode": "deny", "ip_list": ["10.0.0.0/8"]}),
]


@pytest.mark.parametrize(("policy_id", "policy_type", "config"), DUPLICATES, ids=[d[1] for d in DUPLICATES])
@pytest.mark.parametrize("scope", ["api", "tenant", "gateway"])
def test_two_rules_of_one_type_on_one_route_are_refused(
    refusals: Estate, baseline: Baseline, policy_id: str, policy_type: str, config: dict[str, Any], scope: str
) -> None:
    if scope == "gateway":
        owner = None
        generation = refusals.admin.add_policy(policy_id, policy_type, config, tenant_id=owner)
    else:
        owner = TENANT
        targets = ["ref-live"] if scope == "api" else []
        generation = refusals.admin.add_policy(
            policy_id, policy_type, config, tenant_id=owner, scope=scope, targets=targets
        )
    try:
        status = wait_failed(refusals, generation)

        report = status["last_report"]
        assert report["reason"] == "DUPLICATE_POLICY"
        assert policy_id in report["detail"]
        assert f"ref-{policy_type.split('_')[0]}" in report["detail"]  # the rule it collides with
        assert "ref-live" in report["detail"]
        assert_envoy_unchanged(refusals, baseline)
    finally:
        refusals.admin.delete_policy(policy_id, tenant_id=owner)
