"""Who may do what on the CP API: tokens from a trusted issuer with roles, tenant isolation for every
resource (another tenant's objects are absent: 404), platform-level objects, authentication before
any body is read, the static admin token, and the audit log."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass

import asyncpg
import httpx
import pytest
from pydantic import ValidationError
from stoa_cp.settings import Settings
from stoa_harness.site import console_script

PROBLEM = "application/problem+json"
TOOL = "lookup_order"
REPORT = {"generation": "2", "status": "FAILED", "snapshot_version": "", "reason": "NACK"}


@dataclass
class World:
    """Two tenants with one of every tenant object each, both deployed on one gateway."""

    a: str
    b: str
    a_api: str
    b_api: str
    b_prefix: str
    a_policy: str
    b_policy: str
    b_issuer: str
    b_grant: str
    b_revocation: str
    gateway: str
    credential: str
    gateway_policy: str


@pytest.fixture(scope="module")
async def world(cp, idp) -> World:
    async with cp.client() as admin:
        ids = {}
        for side in ("a", "b"):
            tenant = (await admin.create_tenant(f"{side}-{id(idp)}", side))["tenant_id"]
            ids[side] = tenant
            api_id = f"{tenant}-orders"
            await admin.create_api(api_id, tenant_id=tenant, name="Orders", upstream_url="http://127.0.0.1:9")
            ids[f"{side}_api"] = api_id
            rate = {"maxRequests": 5, "intervalSeconds": 1}
            policy = await admin.create_policy(
                f"{tenant}-rl", "rate_limit", rate, tenant_id=tenant, scope="tenant"
            )
            ids[f"{side}_policy"] = policy["policy_id"]
            issuer = await admin.add_issuer(tenant, f"https://{side}.example", jwks=idp.jwks())
            ids[f"{side}_issuer"] = issuer["issuer_id"]
            await admin.create_tool(
                TOOL,
                tenant_id=tenant,
                description="Look an order up",
                input_schema={"type": "object"},
                api_id=api_id,
                method="GET",
                path_template="/orders",
            )
            ids[f"{side}_grant"] = (
                await admin.grant_tool(f"{tenant}-g", TOOL, tenant_id=tenant, scopes=["s"])
            )["grant_id"]
            revoked = await admin.revoke_tool(f"{tenant}-r", TOOL, tenant_id=tenant)
            ids[f"{side}_revocation"] = revoked["revocation_id"]
        gateway = f"gw-{id(idp)}"
        credential = (await admin.create_gateway(gateway, "G"))["credential"]
        for api_id in (ids["a_api"], ids["b_api"]):
            await admin.deploy(api_id, gateway)
        cors = {"allowedOrigins": ["*"]}
        await admin.create_policy(f"{gateway}-cors", "cors", cors, tenant_id=None, gateway_id=gateway)
    async with cp.client(credential) as link:
        report = {**REPORT, "gateway_id": gateway, "detail": f"route {ids['b_api']} refused"}
        assert (
            await link.answer("POST", f"/v1/gateways/{gateway}/sync-reports", json=report)
        ).status_code == 202
    return World(
        a=ids["a"],
        b=ids["b"],
        a_api=ids["a_api"],
        b_api=ids["b_api"],
        b_prefix=f"/apis/{ids['b_api']}",
        a_policy=ids["a_policy"],
        b_policy=ids["b_policy"],
        b_issuer=ids["b_issuer"],
        b_grant=ids["b_grant"],
        b_revocation=ids["b_revocation"],
        gateway=gateway,
        credential=credential,
        gateway_policy=f"{gateway}-cors",
    )


def fields(response: httpx.Response) -> list[str]:
    assert response.headers["content-type"].startswith(PROBLEM), response.text
    return [error["field"] for error in response.json()["errors"]]


def api_body(api_id: str, **extra: object) -> dict:
    return {"api_id": api_id, "name": "X", "upstream_url": "http://127.0.0.1:9", "methods": ["GET"], **extra}


def api_fields() -> dict:
    return {"name": "X", "upstream_url": "http://127.0.0.1:9", "methods": ["GET"]}


def policy_fields() -> dict:
    return {"type": "rate_limit", "config": {"maxRequests": 1, "intervalSeconds": 1}, "scope": "tenant"}


def policy_body(policy_id: str) -> dict:
    config = {"maxRequests": 1, "intervalSeconds": 1}
    return {"policy_id": policy_id, "type": "rate_limit", "config": config, "scope": "tenant", "targets": []}


# Every way a tenant admin of A could reach an object of B: each answers 404, exactly as if absent.
FOREIGN = [
    ("GET", "/v1/tenants/{b}/apis", None, "tenant_id"),
    ("POST", "/v1/tenants/{b}/apis", lambda w: api_body("fresh-1"), "tenant_id"),
    ("GET", "/v1/tenants/{b}/apis/{b_api}", None, "tenant_id"),
    ("PUT", "/v1/tenants/{b}/apis/{b_api}", lambda w: api_fields(), "tenant_id"),
    ("DELETE", "/v1/tenants/{b}/apis/{b_api}", None, "tenant_id"),
    ("GET", "/v1/tenants/{a}/apis/{b_api}", None, "api_id"),
    ("PUT", "/v1/tenants/{a}/apis/{b_api}", lambda w: api_fields(), "api_id"),
    ("DELETE", "/v1/tenants/{a}/apis/{b_api}", None, "api_id"),
    ("POST", "/v1/tenants/{a}/apis", lambda w: api_body(w.b_api), "api_id"),
    ("POST", "/v1/tenants/{a}/apis", lambda w: api_body("fresh-2", path_prefix=w.b_prefix), "path_prefix"),
    ("GET", "/v1/tenants/{b}/policies", None, "tenant_id"),
    ("POST", "/v1/tenants/{b}/policies", lambda w: policy_body("fresh-3"), "tenant_id"),
    ("GET", "/v1/tenants/{b}/policies/{b_policy}", None, "tenant_id"),
    ("PUT", "/v1/tenants/{b}/policies/{b_policy}", lambda w: policy_fields(), "tenant_id"),
    ("DELETE", "/v1/tenants/{b}/policies/{b_policy}", None, "tenant_id"),
    ("GET", "/v1/tenants/{a}/policies/{b_policy}", None, "policy_id"),
    ("DELETE", "/v1/tenants/{a}/policies/{b_policy}", None, "policy_id"),
    ("POST", "/v1/tenants/{a}/policies", lambda w: policy_body(w.b_policy), "policy_id"),
    ("POST", "/v1/tenants/{a}/policies", lambda w: policy_body(w.gateway_policy), "policy_id"),
    ("GET", "/v1/tenants/{b}/issuers", None, "tenant_id"),
    (
        "POST",
        "/v1/tenants/{b}/issuers",
        lambda w: {"issuer": "https://x.example", "jwks_uri": "https://x"},
        "tenant_id",
    ),
    ("DELETE", "/v1/tenants/{b}/issuers/{b_issuer}", None, "tenant_id"),
    ("POST", "/v1/tenants/{b}/issuers/{b_issuer}/refresh", None, "tenant_id"),
    ("DELETE", "/v1/tenants/{a}/issuers/{b_issuer}", None, "issuer_id"),
    ("POST", "/v1/tenants/{a}/issuers/{b_issuer}/refresh", None, "issuer_id"),
    ("POST", "/v1/tenants/{b}/bulk", lambda w: {"apis": [api_body("fresh-9")]}, "tenant_id"),
    ("POST", "/v1/tenants/{a}/bulk", lambda w: {"apis": [api_body(w.b_api)]}, "apis[0].api_id"),
    (
        "POST",
        "/v1/tenants/{a}/bulk",
        lambda w: {"deploy": [{"gateway_id": w.gateway, "api_ids": [w.b_api]}]},
        "deploy[0].api_ids[0]",
    ),
    ("GET", "/v1/tenants/{b}/tools", None, "tenant_id"),
    ("GET", "/v1/tenants/{b}/tools/anything", None, "tenant_id"),
    ("DELETE", "/v1/tenants/{b}/tools/anything", None, "tenant_id"),
    ("GET", "/v1/tenants/{b}/tool-grants", None, "tenant_id"),
    (
        "POST",
        "/v1/tenants/{b}/tool-grants",
        lambda w: {"grant_id": "g", "tool": "t", "scopes": ["s"]},
        "tenant_id",
    ),
    ("GET", "/v1/tenants/{b}/tool-revocations", None, "tenant_id"),
    ("POST", "/v1/tenants/{b}/tool-revocations", lambda w: {"revocation_id": "r", "tool": "t"}, "tenant_id"),
    # Grant and revocation ids are unique across tenants: one another tenant holds is as absent.
    (
        "POST",
        "/v1/tenants/{a}/tool-grants",
        lambda w: {"grant_id": w.b_grant, "tool": TOOL, "scopes": ["s"]},
        "grant_id",
    ),
    ("DELETE", "/v1/tenants/{a}/tool-grants/{b_grant}", None, "grant_id"),
    (
        "POST",
        "/v1/tenants/{a}/tool-revocations",
        lambda w: {"revocation_id": w.b_revocation, "tool": TOOL},
        "revocation_id",
    ),
    ("DELETE", "/v1/tenants/{a}/tool-revocations/{b_revocation}", None, "revocation_id"),
    ("PUT", "/v1/gateways/{gateway}/deployments/{b_api}", None, "api_id"),
    ("DELETE", "/v1/gateways/{gateway}/deployments/{b_api}", None, "api_id"),
    ("GET", "/v1/audit?tenant={b}", None, "tenant"),
]


async def snapshot(cp, w: World) -> list:
    async with cp.client() as admin:
        paths = [
            f"/v1/tenants/{w.b}/apis",
            f"/v1/tenants/{w.b}/policies",
            f"/v1/tenants/{w.b}/issuers",
            f"/v1/tenants/{w.b}/tool-grants",
            f"/v1/tenants/{w.b}/tool-revocations",
            f"/v1/gateways/{w.gateway}/deployments",
            f"/v1/gateways/{w.gateway}/policies",
            f"/v1/gateways/{w.gateway}",
        ]
        return [(await admin.answer("GET", path)).json() for path in paths]


@pytest.mark.parametrize(("method", "path", "body", "field"), FOREIGN)
async def test_a_tenant_admin_finds_nothing_of_another_tenant(
    cp, idp, world, method, path, body, field
) -> None:
    before = await snapshot(cp, world)
    async with cp.client(idp.role_token("tenant_admin", tenant=world.a)) as client:
        response = await client.answer(method, path.format(**vars(world)), json=body(world) if body else None)
    assert response.status_code == 404, response.text
    assert fields(response) == [field]
    assert await snapshot(cp, world) == before


async def test_lists_and_gateway_views_show_a_tenant_its_own_part(cp, idp, world) -> None:
    # Policies the current rules refuse are listed in the gateway's status: only the caller's own.
    conn = await asyncpg.connect(cp.dsn)
    try:
        await conn.execute(
            "UPDATE policies SET invalid_reason = 'refused' WHERE policy_id = ANY($1::text[])",
            [world.a_policy, world.b_policy],
        )
    finally:
        await conn.close()
    async with cp.client() as admin:
        every = (await admin.answer("GET", f"/v1/gateways/{world.gateway}/status")).json()["invalid_policies"]
    assert {world.a_policy, world.b_policy} <= {p["policy_id"] for p in every}
    async with cp.client(idp.role_token("tenant_admin", tenant=world.a)) as client:
        own = (await client.answer("GET", f"/v1/gateways/{world.gateway}/status")).json()["invalid_policies"]
        assert [p["policy_id"] for p in own] == [world.a_policy]
        assert [t["tenant_id"] for t in (await client.answer("GET", "/v1/tenants")).json()] == [world.a]
        assert (await client.answer("GET", f"/v1/gateways/{world.gateway}/deployments")).json() == [
            world.a_api
        ]
        status = (await client.answer("GET", f"/v1/gateways/{world.gateway}/status")).json()
        assert status["last_report"]["reason"] == "NACK"
        assert status["last_report"]["detail"] == ""
        assert world.gateway in [g["gateway_id"] for g in (await client.answer("GET", "/v1/gateways")).json()]
        # The translation preview: its own routes, as the gateway's policies apply to them.
        part = await client.answer("GET", f"/v1/gateways/{world.gateway}/preview")
        assert part.status_code == 200, part.text
        assert (part.json()["tenant_id"], part.json()["snapshot_version"]) == (world.a, None)
        assert world.a_api in json.dumps(part.json()["resources"])
        assert world.b_api not in part.text
    async with cp.client() as admin:
        whole = (await admin.answer("GET", f"/v1/gateways/{world.gateway}/preview")).json()
        assert whole["tenant_id"] is None
        assert whole["snapshot_version"]
        assert world.a_api in json.dumps(whole["resources"])
        assert world.b_api in json.dumps(whole["resources"])
        assert world.b_api in (await admin.answer("GET", f"/v1/gateways/{world.gateway}/status")).text
        deployed = (await admin.answer("GET", f"/v1/gateways/{world.gateway}/deployments")).json()
        assert {world.a_api, world.b_api} <= set(deployed)


@pytest.mark.parametrize(
    ("method", "path", "body"),
    [
        ("POST", "/v1/tenants", {"tenant_id": "nope", "name": "x"}),
        ("POST", "/v1/gateways", {"gateway_id": "nope", "name": "x"}),
        ("GET", "/v1/gateways/{gateway}/policies", None),
        ("GET", "/v1/gateways/{gateway}/policies/{gateway_policy}", None),
        ("DELETE", "/v1/gateways/{gateway}/policies/{gateway_policy}", None),
    ],
)
async def test_platform_objects_need_a_platform_role(cp, idp, world, method, path, body) -> None:
    async with cp.client(idp.role_token("tenant_admin", tenant=world.a)) as client:
        response = await client.answer(method, path.format(**vars(world)), json=body)
    assert response.status_code == 403, response.text
    assert fields(response) == ["authorization"]


async def test_a_tenant_admin_manages_its_own_tenant(cp, idp, world) -> None:
    async with cp.client(idp.role_token("tenant_admin", tenant=world.a, sub="alice")) as client:
        created = await client.answer("POST", f"/v1/tenants/{world.a}/apis", json=api_body(f"{world.a}-new"))
        assert created.status_code == 201, created.text
        deployed = await client.answer("PUT", f"/v1/gateways/{world.gateway}/deployments/{world.a}-new")
        assert deployed.status_code == 200, deployed.text
        repeated = await client.answer("POST", f"/v1/tenants/{world.a}/apis", json=api_body(f"{world.a}-new"))
        assert repeated.status_code == 200, repeated.text  # the same body again: the stored API
        clash = await client.answer(
            "POST", f"/v1/tenants/{world.a}/apis", json=api_body(f"{world.a}-new", name="Y")
        )
        assert clash.status_code == 409  # its own object: a plain conflict
        assert fields(clash) == ["api_id"]
        entries = (await client.answer("GET", "/v1/audit")).json()
    assert all(e["tenant_id"] == world.a or e["actor_tenant"] == world.a for e in entries)
    deploy = next(
        e for e in entries if e["method"] == "PUT" and e["object_ids"].get("api_id") == f"{world.a}-new"
    )
    assert (deploy["subject"], deploy["role"], deploy["actor_tenant"]) == ("alice", "tenant_admin", world.a)
    assert deploy["generations"] == {world.gateway: deployed.json()["generation"]}


async def test_viewers_read_only_and_within_their_tenant(cp, idp, world) -> None:
    async with cp.client(idp.role_token("viewer", tenant=world.a)) as client:
        own = await client.answer("GET", f"/v1/tenants/{world.a}/apis")
        assert world.a_api in [a["api_id"] for a in own.json()]
        assert {a["tenant_id"] for a in own.json()} == {world.a}
        assert (await client.answer("GET", f"/v1/tenants/{world.b}/apis")).status_code == 404
        refused = await client.answer("DELETE", f"/v1/tenants/{world.a}/apis/{world.a_api}")
        assert refused.status_code == 403
        assert fields(refused) == ["authorization"]
        assert (await client.answer("GET", "/v1/audit")).status_code == 403
    async with cp.client(idp.role_token("viewer")) as client:
        other = await client.answer("GET", f"/v1/tenants/{world.b}/apis")
        assert world.b_api in [a["api_id"] for a in other.json()]
        policies = await client.answer("GET", f"/v1/gateways/{world.gateway}/policies")
        assert world.gateway_policy in [p["policy_id"] for p in policies.json()]
        assert (
            await client.answer("POST", "/v1/tenants", json={"tenant_id": "v", "name": "v"})
        ).status_code == 403
    async with cp.client() as admin:
        # Nothing a viewer was refused happened.
        assert (await admin.get_api(world.a_api, tenant_id=world.a))["api_id"] == world.a_api
        assert "v" not in [t["tenant_id"] for t in await admin.tenants()]


async def test_a_platform_admin_token_does_everything(cp, idp) -> None:
    async with cp.client(idp.role_token("platform_admin", sub="root")) as client:
        created = await client.answer(
            "POST", "/v1/tenants", json={"tenant_id": f"p-{id(client)}", "name": "P"}
        )
        assert created.status_code == 201, created.text
        tenant_id = created.json()["tenant_id"]
        entries = (await client.answer("GET", "/v1/audit", params={"tenant": tenant_id})).json()
    [creation] = [e for e in entries if e["method"] == "POST"]
    assert (creation["subject"], creation["role"], creation["tenant_id"]) == (
        "root",
        "platform_admin",
        tenant_id,
    )


@pytest.mark.parametrize(
    "token",
    [
        lambda idp: idp.other_issuer(stoa_roles=["platform_admin"]),
        lambda idp: idp.mint(stoa_roles=["platform_admin"]),  # the gateway audience, not the CP's
        lambda idp: idp.expired(audience="stoa-cp", stoa_roles=["platform_admin"]),
        lambda idp: idp.bad_signature(audience="stoa-cp", stoa_roles=["platform_admin"]),
        lambda idp: idp.alg_none(audience="stoa-cp", stoa_roles=["platform_admin"]),
        lambda idp: idp.hs256_with_public_key(audience="stoa-cp", stoa_roles=["platform_admin"]),
        lambda idp: "not-a-token",
    ],
    ids=["untrusted-issuer", "wrong-audience", "expired", "bad-signature", "alg-none", "hs256", "opaque"],
)
async def test_tokens_that_do_not_verify_are_401(cp, idp, token) -> None:
    async with cp.client(token(idp)) as client:
        response = await client.answer("GET", "/v1/tenants")
    assert response.status_code == 401, response.text
    assert response.headers["www-authenticate"] == 'Bearer error="invalid_token"'


@pytest.mark.parametrize(
    "claims",
    [{"stoa_roles": []}, {"stoa_roles": ["owner"]}, {"stoa_roles": ["tenant_admin"], "tenant": None}],
    ids=["no-role", "unknown-role", "tenant-admin-without-tenant"],
)
async def test_a_valid_token_without_a_usable_role_is_403(cp, idp, claims) -> None:
    async with cp.client(idp.mint(**{"audience": "stoa-cp", "tenant": None, **claims})) as client:
        response = await client.answer("GET", "/v1/tenants")
    assert response.status_code == 403, response.text


async def test_the_roles_and_tenant_claims_are_settings(cp_factory, idp) -> None:
    other = await cp_factory(oidc_issuers=[idp.issuer], roles_claim="groups", tenant_claim="org")
    async with other.client() as admin:
        for tenant in ("org-a", "org-b"):
            await admin.create_tenant(tenant, tenant)
    renamed = idp.mint(audience="stoa-cp", tenant=None, groups=["tenant_admin"], org="org-a")
    async with other.client(renamed) as client:
        assert [t["tenant_id"] for t in (await client.answer("GET", "/v1/tenants")).json()] == ["org-a"]
        assert (await client.answer("GET", "/v1/tenants/org-b/apis")).status_code == 404
    # The default claim names mean nothing to this CP.
    async with other.client(idp.role_token("platform_admin")) as client:
        assert (await client.answer("GET", "/v1/tenants")).status_code == 403


async def test_authentication_comes_before_the_body(cp, world) -> None:
    oversized = b"{" + b" " * (8 * 1024 * 1024) + b"}"
    async with cp.client(None, timeout=30) as client:
        for method, path, content in [
            ("POST", "/v1/tenants", oversized),
            ("POST", "/v1/tenants", b"\xff not json"),
            ("PUT", f"/v1/tenants/{world.a}/apis/{world.a_api}", b"{}"),
            ("POST", f"/v1/gateways/{world.gateway}/sync-reports", oversized),
            ("GET", "/v1/no-such-thing", b""),
        ]:
            response = await client.answer(
                method, path, content=content, headers={"content-type": "application/json"}
            )
            assert response.status_code == 401, (path, response.text)
            assert response.headers["www-authenticate"] == "Bearer"


async def test_credentials_do_not_cross(cp, idp, world) -> None:
    async with cp.client(world.credential) as link:
        assert (await link.answer("GET", "/v1/tenants")).status_code == 401
    async with cp.client(idp.role_token("platform_admin")) as client:
        assert (await client.answer("GET", f"/v1/gateways/{world.gateway}/config")).status_code == 401


def test_the_static_admin_token_is_refused_in_production() -> None:
    with pytest.raises(ValidationError, match="STOA_CP_ADMIN_TOKENS"):
        Settings(database_url="postgresql://x", admin_tokens=["t"], STOA_ENV="production")
    assert Settings(database_url="postgresql://x", STOA_ENV="production").env == "production"


def test_the_cp_does_not_start_in_production_with_a_static_admin_token() -> None:
    env = {
        "PATH": os.environ["PATH"],
        "STOA_ENV": "production",
        "STOA_CP_DATABASE_URL": "postgresql://127.0.0.1:9/none",
        "STOA_CP_ADMIN_TOKENS": "bootstrap-token",
    }
    done = subprocess.run([console_script("stoa-cp")], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "STOA_CP_ADMIN_TOKENS is for bootstrap only" in done.stderr
    assert "bootstrap-token" not in done.stderr + done.stdout


async def test_every_write_is_audited_without_a_secret(cp, idp, world) -> None:
    token = idp.role_token("platform_admin", sub="auditor")
    async with cp.client(token) as client:
        before = (await client.answer("GET", "/v1/audit", params={"limit": 1})).json()[0]["id"]
        tenant = f"aud-{id(client)}"
        gateway = f"gw-aud-{id(client)}"
        writes = [
            ("POST", "/v1/tenants", {"tenant_id": tenant, "name": "A"}),
            ("POST", "/v1/gateways", {"gateway_id": gateway, "name": "G"}),
            ("POST", f"/v1/tenants/{tenant}/apis", api_body(f"{tenant}-x")),
            ("PUT", f"/v1/gateways/{gateway}/deployments/{tenant}-x", None),
            ("POST", f"/v1/tenants/{tenant}/policies", policy_body(f"{tenant}-p")),
            ("POST", f"/v1/tenants/{tenant}/issuers", {"issuer": "https://i.example", "jwks": idp.jwks()}),
            (
                "POST",
                f"/v1/gateways/{gateway}/policies",
                {"policy_id": f"{gateway}-p", "type": "cors", "config": {"allowedOrigins": ["*"]}},
            ),
            ("DELETE", f"/v1/tenants/{tenant}/apis/{tenant}-x", None),
            ("POST", f"/v1/tenants/{tenant}/apis", {"api_id": "bad id"}),
            (
                "POST",
                f"/v1/tenants/{tenant}/bulk",
                {
                    "apis": [api_body(f"{tenant}-b")],
                    "deploy": [{"gateway_id": gateway, "api_ids": [f"{tenant}-b"]}],
                },
            ),
        ]
        answers = [await client.answer(m, p, json=b) for m, p, b in writes]
        credential = answers[1].json()["credential"]
        entries = (await client.answer("GET", "/v1/audit", params={"limit": 1000})).json()
    new = [e for e in reversed(entries) if e["id"] > before and e["subject"] == "auditor"]
    assert [(e["method"], e["path"], e["status"]) for e in new] == [
        (m, p, a.status_code) for (m, p, _), a in zip(writes, answers, strict=True)
    ]
    assert new[2]["object_ids"] == {"tenant_id": tenant, "api_id": f"{tenant}-x"}
    assert new[3]["generations"] == {gateway: answers[3].json()["generation"]}
    assert new[3]["tenant_id"] == tenant
    assert new[6]["tenant_id"] is None  # a platform object
    assert set(new[7]["generations"]) == {gateway}
    assert new[9]["object_ids"] == {"tenant_id": tenant, "api_ids": f"{tenant}-b"}
    assert new[9]["generations"] == answers[9].json()["generations"]
    dumped = json.dumps(entries)
    for secret in (token, credential, cp.settings.admin_tokens[0], idp.jwks()["keys"][0]["x"]):
        assert secret not in dumped
