"""The CP's bounds, seen at the gateway: a policy listing more entries than its limit, a body over its
limit and an API past the tenant's route limit are refused by the CP naming the limit, and the gateway
keeps serving exactly what it served. Limits lowered by settings so that the bodies stay small."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest
from stoa_harness.cp_client import CPError
from stoa_harness.estate import Estate, EstateOptions

TENANT = "lim"
ORIGIN = "https://app.example.com"
NEW_ORIGIN = "https://new.example.com"


@pytest.fixture(scope="module")
def estate(estates: Callable[..., Estate]) -> Estate:
    cp_env = {
        "STOA_CP_POLICY_MAX_ORIGINS": "3",
        "STOA_CP_MAX_ROUTES_PER_TENANT": "2",
        "STOA_CP_MAX_BODY_BYTES": "65536",
    }
    return estates(EstateOptions(cp_env=cp_env), "estate-limits")


def preflight(estate: Estate, origin: str) -> httpx.Response:
    return estate.gateway.options(
        estate.url("/apis/lim-a/x"), headers={"origin": origin, "access-control-request-method": "GET"}
    )


def message(response: httpx.Response) -> str:
    return " ".join(e["message"] for e in response.json()["errors"])


def test_over_limit_writes_are_refused_naming_the_limit_and_the_gateway_keeps_its_config(estate) -> None:
    admin = estate.admin
    estate.publish("lim-a", tenant_id=TENANT)
    admin.create_policy("lim-cors", "cors", {"allowedOrigins": [ORIGIN]}, tenant_id=TENANT, scope="tenant")
    admin.wait_synced()
    assert preflight(estate, ORIGIN).headers.get("access-control-allow-origin") == ORIGIN
    generation = admin.desired_generation()

    four = [ORIGIN, NEW_ORIGIN, "https://b.example.com", "https://c.example.com"]
    policy_path = f"/v1/tenants/{TENANT}/policies/lim-cors"
    over = admin.answer(
        "PUT", policy_path, json={"type": "cors", "scope": "tenant", "config": {"allowedOrigins": four}}
    )
    assert over.status_code == 422, over.text
    assert [e["field"] for e in over.json()["errors"]] == ["config.allowedOrigins"]
    assert "policy_max_origins" in message(over)

    big = admin.answer(
        "PUT",
        policy_path,
        content=b'{"pad": "' + b"x" * 70_000 + b'"}',
        headers={"content-type": "application/json"},
    )
    assert big.status_code == 413, big.text
    assert "max_body_bytes" in message(big)

    second = estate.publish("lim-b", tenant_id=TENANT)
    with pytest.raises(CPError) as refused:
        estate.create_api("lim-c", tenant_id=TENANT)
    assert refused.value.status_code == 422
    assert "max_routes_per_tenant" in str(refused.value)
    admin.wait_synced(second)
    assert admin.desired_generation() == generation + 1

    # At the gateway: the new origin is not allowed, the refused API is not routed, the rest serves.
    assert preflight(estate, NEW_ORIGIN).headers.get("access-control-allow-origin") is None
    assert preflight(estate, ORIGIN).headers.get("access-control-allow-origin") == ORIGIN
    assert estate.gateway.get(estate.url("/apis/lim-c/x")).status_code == 404
