"""The site's rules at the CP's door: two policies of one type on one route (409 naming the other),
and policies stored before typed configs (migrated to the normal form, or kept and marked invalid)."""

from __future__ import annotations

import json
import uuid

import asyncpg
import pytest
from stoa_cp.auth import digest
from stoa_cp.store.database import migration_files
from stoa_harness.cp_client import fresh_id

RL = {"maxRequests": 5, "intervalSeconds": 1}


async def test_a_second_policy_of_a_type_on_a_route_is_409_naming_the_first(api) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, _ = await api.new_gateway()
    api_id = await api.new_api(tenant_id)
    await api.deploy(api_id, gateway_id)
    first = fresh_id("p")
    url = f"/v1/tenants/{tenant_id}/policies"
    await api.create_policy(first, "rate_limit", RL, tenant_id=tenant_id, scope="tenant")
    before = await api.generation(gateway_id)

    attempts = [
        (
            url,
            {
                "policy_id": fresh_id("p"),
                "type": "rate_limit",
                "config": RL,
                "scope": "api",
                "targets": [api_id],
            },
        ),
        (
            f"/v1/gateways/{gateway_id}/policies",
            {"policy_id": fresh_id("p"), "type": "rate_limit", "config": RL},
        ),
    ]
    for path, attempt in attempts:
        response = await api.answer("POST", path, json=attempt)
        assert response.status_code == 409, response.text
        (error,) = response.json()["errors"]
        assert error["field"] == "policy_id"
        assert error["message"].startswith(
            f"policy {first} of type rate_limit already applies to route {api_id}"
        )
    # Another type on the same route is fine.
    other = {"mode": "deny", "ip_list": ["10.0.0.1"]}
    await api.create_policy(fresh_id("p"), "ip_filter", other, tenant_id=None, gateway_id=gateway_id)
    listed = [p["policy_id"] for p in (await api.answer("GET", url)).json()]
    assert listed == [first]
    assert await api.generation(gateway_id) == before + 1


async def test_a_deployment_that_would_put_two_policies_of_a_type_on_a_route_is_409(api) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, _ = await api.new_gateway()
    api_id = await api.new_api(tenant_id)
    tenant_policy = await api.create_policy(
        fresh_id("p"), "rate_limit", RL, tenant_id=tenant_id, scope="tenant"
    )
    gateway_policy = await api.create_policy(
        fresh_id("p"), "rate_limit", RL, tenant_id=None, gateway_id=gateway_id
    )
    before = await api.generation(gateway_id)
    response = await api.answer("PUT", f"/v1/gateways/{gateway_id}/deployments/{api_id}")
    assert response.status_code == 409, response.text
    (error,) = response.json()["errors"]
    assert error["field"] == "api_id"
    names = sorted([tenant_policy["policy_id"], gateway_policy["policy_id"]])
    assert f"policies {names[0]} and {names[1]} of type rate_limit" in error["message"]
    assert (await api.answer("GET", f"/v1/gateways/{gateway_id}/deployments")).json() == []
    assert await api.generation(gateway_id) == before


LEGACY = [
    # (policy_id, type, config): what a CP before typed configs stored.
    ("legacy-cors", "cors", {"allowedOrigins": ["https://a.example"], "allowedMethods": ["get"]}),
    ("legacy-logging", "logging", {"level": "debug"}),
    ("legacy-rl", "rate_limit", {"maxRequests": 0, "intervalSeconds": 1}),
]


@pytest.fixture
async def legacy_dsn(pg) -> str:
    """A database as a CP before typed policy configs left it: one tenant, one deployed API, one
    gateway (credential "legacy-credential") and the LEGACY policies."""
    dsn = pg.create_database(f"cp_{uuid.uuid4().hex[:12]}")
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE schema_migrations"
            " (version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        for version, sql in migration_files():
            if version >= "0004":
                break
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
        await conn.execute("INSERT INTO tenants (tenant_id, name) VALUES ('lt', 'Legacy')")
        await conn.execute(
            "INSERT INTO apis (api_id, tenant_id, name, upstream_url, path_prefix, methods)"
            " VALUES ('la', 'lt', 'A', 'http://127.0.0.1:9', '/apis/la', '{GET}')"
        )
        await conn.execute(
            "INSERT INTO gateways (gateway_id, name, credential_sha256) VALUES ('lg', 'G', $1)",
            digest("legacy-credential"),
        )
        await conn.execute("INSERT INTO deployments (gateway_id, api_id) VALUES ('lg', 'la')")
        for policy_id, kind, config in LEGACY:
            await conn.execute(
                "INSERT INTO policies (policy_id, type, config, scope, tenant_id)"
                " VALUES ($1, $2, $3, 'tenant', 'lt')",
                policy_id,
                kind,
                json.dumps(config),
            )
    finally:
        await conn.close()
    return dsn


async def test_stored_policies_are_migrated_or_kept_marked_invalid(cp_factory, legacy_dsn) -> None:
    cp = await cp_factory(dsn=legacy_dsn)
    async with cp.client() as admin, cp.client("legacy-credential") as gateway:
        policies = {p["policy_id"]: p for p in (await admin.answer("GET", "/v1/tenants/lt/policies")).json()}
        assert policies["legacy-cors"]["config"] == {
            "allowedOrigins": ["https://a.example"],
            "allowedMethods": ["GET"],
        }
        assert policies["legacy-cors"]["invalid_reason"] is None
        assert policies["legacy-logging"]["invalid_reason"] == (
            "'logging' is not a supported policy type"
            " (supported: cors, rate_limit, ip_filter, guardrails, transform, opa, compression, token_budget)"
        )
        assert policies["legacy-logging"]["config"] == {"level": "debug"}
        assert (
            policies["legacy-rl"]["invalid_reason"]
            == "config.maxRequests is required: a whole number of at least 1"
        )

        inventory = (await gateway.answer("GET", "/v1/gateways/lg/config")).json()
        assert inventory["schema_version"] == 2
        assert int(inventory["generation"]) == 2  # the migration changed what the gateway publishes
        (cors,) = inventory["policies"]
        assert cors["policy_id"] == "legacy-cors"
        assert cors["cors"]["allowed_methods"] == ["GET"]

        status = (await admin.answer("GET", "/v1/gateways/lg/status")).json()
        assert [p["policy_id"] for p in status["invalid_policies"]] == ["legacy-logging", "legacy-rl"]

        # A valid config written over an invalid policy makes it valid and published again.
        fixed = {"type": "rate_limit", "config": RL, "scope": "tenant"}
        response = await admin.answer("PUT", "/v1/tenants/lt/policies/legacy-rl", json=fixed)
        assert response.status_code == 200, response.text
        assert response.json()["invalid_reason"] is None
        inventory = (await gateway.answer("GET", "/v1/gateways/lg/config")).json()
        assert sorted(p["policy_id"] for p in inventory["policies"]) == ["legacy-cors", "legacy-rl"]
