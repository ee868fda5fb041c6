"""CP HTTP API: CRUD, admin and gateway credentials, problem bodies, and errors that change nothing."""

from __future__ import annotations

import uuid

import asyncpg
import httpx
import pytest
from stoa_cp.store.database import migrate
from stoa_harness.cp_client import fresh_id
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import wait_until_async

PROBLEM = "application/problem+json"


def problem_fields(response: httpx.Response) -> list[str]:
    assert response.headers["content-type"].startswith(PROBLEM), response.text
    return [error["field"] for error in response.json()["errors"]]


async def test_health_and_openapi(cp) -> None:
    async with cp.client(None) as client:
        assert (await client.answer("GET", "/health/live")).status_code == 200
        assert (await client.answer("GET", "/health/ready")).json() == {"status": "ready"}
        paths = (await client.answer("GET", "/openapi.json")).json()["paths"]
    for path in (
        "/v1/tenants",
        "/v1/tenants/{tenant_id}/apis/{api_id}",
        "/v1/gateways/{gateway_id}/deployments/{api_id}",
        "/v1/gateways/{gateway_id}/config",
        "/v1/gateways/{gateway_id}/events",
        "/v1/gateways/{gateway_id}/sync-reports",
        "/v1/gateways/{gateway_id}/status",
        "/v1/tenants/{tenant_id}/policies/{policy_id}",
        "/v1/gateways/{gateway_id}/policies/{policy_id}",
        "/v1/tenants/{tenant_id}/issuers/{issuer_id}/refresh",
    ):
        assert path in paths


@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", "Basic dGVzdDp0ZXN0"])
async def test_admin_endpoints_refuse_without_the_admin_token(cp, authorization) -> None:
    headers = {"authorization": authorization} if authorization else {}
    async with cp.client(None) as client:
        response = await client.answer(
            "POST", "/v1/tenants", json={"tenant_id": "sneaky", "name": "x"}, headers=headers
        )
        assert response.status_code == 401
        challenge = 'Bearer error="invalid_token"' if authorization == "Bearer wrong-token" else "Bearer"
        assert response.headers["www-authenticate"] == challenge
        assert problem_fields(response) == ["authorization"]
    async with cp.client() as admin:
        tenants = (await admin.answer("GET", "/v1/tenants")).json()
    assert "sneaky" not in [t["tenant_id"] for t in tenants]


async def test_api_crud_with_defaults(api) -> None:
    tenant_id = await api.new_tenant()
    api_id = fresh_id("orders")
    created = await api.answer(
        "POST",
        f"/v1/tenants/{tenant_id}/apis",
        json={
            "api_id": api_id,
            "name": "Orders",
            "upstream_url": "https://orders.internal:8443/base",
            "methods": ["get", "POST"],
        },
    )
    assert created.status_code == 201, created.text
    body = created.json()
    assert body["path_prefix"] == f"/apis/{api_id}"
    assert body["methods"] == ["GET", "POST"]
    assert body["auth"] == {
        "mode": "jwt",
        "scopes": [],
        "forward_credential": False,
        "envelope": False,
        "key_header": None,
        "subscription": False,
    }
    assert body["timeout_ms"] is None

    update = {
        "name": "Orders v2",
        "upstream_url": "http://127.0.0.1:9001",
        "path_prefix": "/orders",
        "methods": ["GET"],
        "timeout_ms": 2500,
        "auth": {"mode": "jwt", "forward_credential": True, "envelope": True},
    }
    updated = await api.answer("PUT", f"/v1/tenants/{tenant_id}/apis/{api_id}", json=update)
    assert updated.status_code == 200, updated.text
    got = (await api.answer("GET", f"/v1/tenants/{tenant_id}/apis/{api_id}")).json()
    assert (got["name"], got["path_prefix"], got["timeout_ms"], got["auth"]) == (
        "Orders v2",
        "/orders",
        2500,
        {
            "mode": "jwt",
            "scopes": [],
            "forward_credential": True,
            "envelope": True,
            "key_header": None,
            "subscription": False,
        },
    )
    listed = (await api.answer("GET", f"/v1/tenants/{tenant_id}/apis")).json()
    assert [a["api_id"] for a in listed] == [api_id]

    assert (await api.answer("DELETE", f"/v1/tenants/{tenant_id}/apis/{api_id}")).status_code == 204
    gone = await api.answer("GET", f"/v1/tenants/{tenant_id}/apis/{api_id}")
    assert gone.status_code == 404
    assert problem_fields(gone) == ["api_id"]


async def test_a_path_prefix_is_stored_as_the_gateway_matches_it(api) -> None:
    tenant_id = await api.new_tenant()
    # Without its trailing slash: the site matches `/a/` as `/a`.
    prefix = f"/{fresh_id('s')}"
    api_id = await api.new_api(tenant_id, path_prefix=f"{prefix}/")
    stored = await api.answer("GET", f"/v1/tenants/{tenant_id}/apis/{api_id}")
    assert stored.json()["path_prefix"] == prefix


async def test_duplicates_are_conflicts_naming_the_id(api) -> None:
    tenant_id = await api.new_tenant()
    other_tenant = await api.new_tenant()
    api_id = await api.new_api(tenant_id)
    gateway_id, _ = await api.new_gateway()
    cases = [
        ("/v1/tenants", {"tenant_id": tenant_id, "name": "again"}, "tenant_id"),
        ("/v1/gateways", {"gateway_id": gateway_id, "name": "again"}, "gateway_id"),
        # api_id is unique across tenants
        (
            f"/v1/tenants/{other_tenant}/apis",
            {"api_id": api_id, "name": "x", "upstream_url": "http://127.0.0.1:1", "methods": ["GET"]},
            "api_id",
        ),
        (
            f"/v1/tenants/{other_tenant}/apis",
            {
                "api_id": fresh_id("a"),
                "name": "x",
                "upstream_url": "http://127.0.0.1:1",
                "methods": ["GET"],
                "path_prefix": f"/apis/{api_id}",
            },
            "path_prefix",
        ),
        # The same prefix for the site, which matches `/a/` as `/a`.
        (
            f"/v1/tenants/{other_tenant}/apis",
            {
                "api_id": fresh_id("a"),
                "name": "x",
                "upstream_url": "http://127.0.0.1:1",
                "methods": ["GET"],
                "path_prefix": f"/apis/{api_id}/",
            },
            "path_prefix",
        ),
    ]
    for path, body, field in cases:
        response = await api.answer("POST", path, json=body)
        assert response.status_code == 409, (path, response.text)
        assert problem_fields(response) == [field]
    assert (await api.answer("GET", f"/v1/tenants/{other_tenant}/apis")).json() == []


BAD_APIS = [
    ({"upstream_url": "ftp://host/x"}, "upstream_url"),
    ({"upstream_url": "not a url"}, "upstream_url"),
    ({"upstream_url": "http://user:pw@host"}, "upstream_url"),
    ({"upstream_url": "http://host:99999"}, "upstream_url"),
    ({"methods": ["FETCH"]}, "methods[0]"),
    ({"methods": []}, "methods"),
    ({"path_prefix": "no-slash"}, "path_prefix"),
    ({"path_prefix": "/a/../b"}, "path_prefix"),
    ({"api_id": "bad id!"}, "api_id"),
    ({"timeout_ms": 0}, "timeout_ms"),
    ({"auth": {"mode": "basic"}}, "auth.mode"),
    ({"auth": {"mode": "jwt", "scopes": ["has space"]}}, "auth.scopes[0]"),
    ({"auth": {"mode": "none", "envelope": True}}, "auth.envelope"),
    ({"auth": {"mode": "none", "forward_credential": True}}, "auth.forward_credential"),
    ({"surprise": 1}, "surprise"),
    # What PostgreSQL cannot store, and upstreams the Link would refuse, are refused here already.
    ({"name": "a\u0000b"}, "name"),
    ({"upstream_url": "http://h\u00e9llo.example"}, "upstream_url"),
    ({"upstream_url": "http://under_score.example"}, "upstream_url"),
    ({"upstream_url": "http://1.2.3.4.5"}, "upstream_url"),
    ({"upstream_url": "http://host:0"}, "upstream_url"),
    ({"upstream_url": "http://host/a//b"}, "upstream_url"),
    ({"upstream_url": "http://host/?"}, "upstream_url"),
    ({"upstream_url": "http://host/" + "a" * 5000}, "upstream_url"),
    ({"path_prefix": "/" + "a" * 5000}, "path_prefix"),
]


@pytest.mark.parametrize(("override", "field"), BAD_APIS)
async def test_bad_api_input_is_422_naming_the_field_and_changes_nothing(api, override, field) -> None:
    tenant_id = await api.new_tenant()
    body = {"api_id": fresh_id("a"), "name": "x", "upstream_url": "http://127.0.0.1:1", "methods": ["GET"]}
    body.update(override)
    response = await api.answer("POST", f"/v1/tenants/{tenant_id}/apis", json=body)
    assert response.status_code == 422, response.text
    assert field in problem_fields(response)
    # The rule in words (shown next to the field in the console), never a regular expression.
    assert not [e for e in response.json()["errors"] if "pattern" in e["message"]], response.text
    assert (await api.answer("GET", f"/v1/tenants/{tenant_id}/apis")).json() == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"tenant_id": "t", "name": ', "body"),
        (b"\xff\xfe", "body"),
        (b"[1, 2]", "body"),
        (b'{"tenant_id": "t", "name": NaN}', "name"),
        (b'{"tenant_id": "t", "name": "a\\ud800b"}', "name"),
        (b'{"tenant_id": ["t"], "name": "x"}', "tenant_id"),
    ],
)
async def test_malformed_json_is_422_naming_the_field(api, body, field) -> None:
    before = (await api.answer("GET", "/v1/tenants")).json()
    response = await api.answer(
        "POST", "/v1/tenants", content=body, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert problem_fields(response) == [field]
    assert (await api.answer("GET", "/v1/tenants")).json() == before


@pytest.mark.parametrize(
    ("method", "path", "field"),
    [
        ("GET", "/v1/tenants/a%00b/apis", "tenant_id"),
        ("GET", "/v1/tenants/{tenant}/apis/a%00b", "api_id"),
        ("GET", "/v1/gateways/a%00b/status", "gateway_id"),
        ("PUT", "/v1/gateways/{gateway}/deployments/a%00b", "api_id"),
        ("DELETE", "/v1/tenants/{tenant}/issuers/a%00b", "issuer_id"),
        ("GET", "/v1/tenants/{tenant}/policies/a%00b", "policy_id"),
    ],
)
async def test_an_id_the_store_cannot_hold_is_422_naming_it(api, method, path, field) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, _ = await api.new_gateway()
    response = await api.answer(method, path.format(tenant=tenant_id, gateway=gateway_id))
    assert response.status_code == 422, response.text
    assert problem_fields(response) == [field]
    assert await api.generation(gateway_id) == 1


async def test_unicode_and_slashed_ids_are_unknown_not_errors(api) -> None:
    for path in ("/v1/gateways/%C3%BC/status", "/v1/tenants/%C3%BC/apis", "/v1/gateways/" + "x" * 5000):
        response = await api.answer("GET", path)
        assert response.status_code == 404, (path, response.text)
        assert response.headers["content-type"].startswith(PROBLEM)
    # An encoded slash does not match a route: a plain 404 problem, not a 500.
    assert (await api.answer("GET", "/v1/gateways/a%2Fb/status")).status_code == 404


async def test_missing_fields_are_each_named(api) -> None:
    tenant_id = await api.new_tenant()
    response = await api.answer("POST", f"/v1/tenants/{tenant_id}/apis", json={"api_id": fresh_id("a")})
    assert response.status_code == 422
    assert set(problem_fields(response)) == {"name", "upstream_url", "methods"}


async def test_unknown_tenant_is_404_naming_tenant_id(api) -> None:
    body = {"api_id": fresh_id("a"), "name": "x", "upstream_url": "http://127.0.0.1:1", "methods": ["GET"]}
    response = await api.answer("POST", "/v1/tenants/nobody/apis", json=body)
    assert response.status_code == 404
    assert problem_fields(response) == ["tenant_id"]
    assert (await api.answer("GET", "/v1/tenants/nobody/apis")).status_code == 404


async def test_api_of_another_tenant_is_not_found(api) -> None:
    owner, stranger = await api.new_tenant(), await api.new_tenant()
    api_id = await api.new_api(owner)
    update = {"name": "x", "upstream_url": "http://127.0.0.1:2", "methods": ["GET"]}
    assert (await api.answer("PUT", f"/v1/tenants/{stranger}/apis/{api_id}", json=update)).status_code == 404
    assert (await api.answer("DELETE", f"/v1/tenants/{stranger}/apis/{api_id}")).status_code == 404
    got = (await api.answer("GET", f"/v1/tenants/{owner}/apis/{api_id}")).json()
    assert got["upstream_url"] == "http://127.0.0.1:9000"


async def test_gateway_credential_is_shown_once_and_checked(api, cp) -> None:
    gateway_id, credential = await api.new_gateway()
    other_id, other_credential = await api.new_gateway()
    listed = (await api.answer("GET", "/v1/gateways")).json()
    assert all("credential" not in g for g in listed)

    report = {"gateway_id": gateway_id, "generation": 1, "status": "SYNCED", "snapshot_version": "v1"}
    endpoints = [
        ("GET", f"/v1/gateways/{gateway_id}/config", None),
        ("GET", f"/v1/gateways/{gateway_id}/events", None),
        ("POST", f"/v1/gateways/{gateway_id}/sync-reports", report),
    ]
    expectations = [(None, 401), ("not-a-credential", 401), ("ADMIN", 401), (other_credential, 403)]
    async with cp.client(None, timeout=5) as client:
        for method, path, body in endpoints:
            for presented, status in expectations:
                token = "test-admin-token" if presented == "ADMIN" else presented
                headers = {"authorization": f"Bearer {token}"} if token else {}
                response = await client.answer(method, path, json=body, headers=headers)
                assert response.status_code == status, (method, path, presented, response.text)
                assert problem_fields(response) == ["authorization"]
        # An unknown gateway with a valid credential of another gateway: 403, never a hint of existence.
        response = await client.answer(
            "GET", "/v1/gateways/nope/config", headers={"authorization": f"Bearer {credential}"}
        )
        assert response.status_code == 403
        assert problem_fields(response) == ["authorization"]
    status = (await api.answer("GET", f"/v1/gateways/{gateway_id}/status")).json()
    assert status["last_report"] is None
    assert status["state"] == "PENDING"
    assert other_id != gateway_id
    inventory = await api.inventory(gateway_id, credential=credential)
    assert inventory["gateway_id"] == gateway_id
    assert inventory["generation"] == "1"


async def test_ready_is_503_when_the_database_is_unreachable(cp_factory, api) -> None:
    with EmbeddedPostgres() as own_pg:
        doomed = await cp_factory(dsn=own_pg.dsn)
        async with doomed.client(None, timeout=5) as client:
            assert (await client.answer("GET", "/health/ready")).status_code == 200
            own_pg.stop()

            async def not_ready() -> bool:
                return (await client.answer("GET", "/health/ready")).status_code == 503

            await wait_until_async(not_ready, 15, "readiness to report the database down")
            response = await client.answer("GET", "/health/ready")
            assert response.json()["errors"][0]["field"] == "database"
            assert (await client.answer("GET", "/health/live")).status_code == 200


async def test_prefixes_stored_with_a_trailing_slash_take_the_form_the_site_matches(
    pg: EmbeddedPostgres,
) -> None:
    """Rows written before prefixes were normalised: each takes its form without the slash, unless
    another API holds (or would take) the same prefix, a conflict left for the operator."""
    dsn = pg.create_database(f"cp_{uuid.uuid4().hex[:12]}")
    conn = await asyncpg.connect(dsn)
    try:
        await migrate(conn)
        await conn.execute("INSERT INTO tenants (tenant_id, name) VALUES ('t', 't')")
        for api_id, prefix in (
            ("lone", "/lone/"),
            ("root", "/"),
            ("a", "/a"),
            ("a-slash", "/a/"),
            ("b", "/b//"),
        ):
            await conn.execute(
                "INSERT INTO apis (api_id, tenant_id, name, upstream_url, path_prefix, methods)"
                " VALUES ($1, 't', $1, 'http://127.0.0.1:9', $2, '{GET}')",
                api_id,
                prefix,
            )
        await conn.execute("DELETE FROM schema_migrations WHERE version = '0020_path_prefix_trailing_slash'")
        assert await migrate(conn) == ["0020_path_prefix_trailing_slash"]
        rows = dict(await conn.fetch("SELECT api_id, path_prefix FROM apis"))
    finally:
        await conn.close()
    assert rows == {"lone": "/lone", "root": "/", "a": "/a", "a-slash": "/a/", "b": "/b"}
