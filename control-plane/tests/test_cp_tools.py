"""MCP on the CP: API kind mcp, the tool registry (validated by the translator's rules), grants and
revocations (tenant-scoped, audited), and the signed tool permissions (re-signed on every change,
seq growing, no generation moved), delivered on the gateway's event stream."""

from __future__ import annotations

import asyncio
import base64
import json
import uuid
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from httpx_sse import aconnect_sse
from stoa_cp.permissions import SigningKeyError, public_jwk, write_key
from stoa_harness.cp_client import CPError, fresh_id
from stoa_harness.wait import wait_until_async

SCHEMA = {"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]}


def claims(jws: str) -> dict:
    body = jws.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))


def header(jws: str) -> dict:
    head = jws.split(".")[0]
    return json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))


@pytest.fixture(scope="module")
def key_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("signing")
    write_key(folder / "0001.pem")
    return folder


@pytest.fixture
async def signing_cp(cp_factory, idp, key_dir):
    return await cp_factory(
        mcp_signing_key_dir=str(key_dir),
        mcp_permissions_check_s=0.2,
        oidc_issuers=[idp.issuer],
        sse_ping_s=0.5,
    )


def test_a_signing_key_file_must_be_an_unencrypted_ed25519_pem(tmp_path: Path) -> None:
    kid = write_key(tmp_path / "good.pem")
    assert public_jwk(tmp_path / "good.pem")["kid"] == kid
    (tmp_path / "garbage.pem").write_bytes(b"not a key")
    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    (tmp_path / "ec.pem").write_bytes(ec_pem)
    for name, said in (
        ("garbage.pem", "is not an unencrypted PEM private key"),
        ("ec.pem", "is not an Ed25519 key"),
    ):
        with pytest.raises(SigningKeyError) as refused:
            public_jwk(tmp_path / name)
        assert str(refused.value) == f"signing key {tmp_path / name} {said}"


def tool_fields(api_id: str, **fields) -> dict:
    """A tool's fields on `api_id` (a GET of one order unless `fields` say otherwise)."""
    return {
        "description": "d",
        "input_schema": SCHEMA,
        "api_id": api_id,
        "method": "GET",
        "path_template": "/o/{id}",
        **fields,
    }


async def _setup(client, tenant_id: str) -> str:
    await client.create_tenant(tenant_id)
    api_id = f"orders-{uuid.uuid4().hex[:6]}"
    await client.create_api(
        api_id, tenant_id=tenant_id, upstream_url="http://127.0.0.1:9000/v1", methods=["GET"]
    )
    return api_id


async def _mcp_site(api) -> tuple[str, str, str, str]:
    """A new tenant with an API of GET and POST (for tools to call) and an MCP route deployed on a new
    gateway: (the tenant, the gateway, its credential, the API)."""
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    backing = await api.new_api(tenant_id, methods=["GET", "POST"])
    mcp_api = fresh_id("mcp")
    await api.create_mcp_api(mcp_api, tenant_id=tenant_id, path_prefix=f"/{fresh_id('m')}")
    await api.deploy(mcp_api, gateway_id)
    return tenant_id, gateway_id, credential, backing


async def test_mcp_api_kind_has_no_upstream_and_carries_the_envelope(api):
    tenant_id = await api.new_tenant()
    created = await api.create_mcp_api(fresh_id("mcp"), tenant_id=tenant_id, path_prefix=f"/{fresh_id('m')}")
    assert created["kind"] == "mcp"
    assert created["upstream_url"] is None
    assert created["auth"]["envelope"] is True


# An MCP API is served by the module: an upstream, or no verified caller to put in the envelope, breaks it.
MCP_WITH_UPSTREAM = {"name": "x", "kind": "mcp", "upstream_url": "http://127.0.0.1:1", "methods": ["GET"]}
MCP_WITHOUT_IDENTITY = {"name": "x", "kind": "mcp", "methods": ["GET"], "auth": {"mode": "none"}}


@pytest.mark.parametrize(
    ("body", "field"),
    [(MCP_WITH_UPSTREAM, "upstream_url"), (MCP_WITHOUT_IDENTITY, "auth.mode")],
    ids=["upstream", "no-identity"],
)
@pytest.mark.parametrize("bulk", [False, True], ids=["alone", "bulk"])
async def test_an_mcp_api_against_the_kind_rules_is_refused_naming_the_field(api, body, field, bulk):
    tenant_id = await api.new_tenant()
    item = {"api_id": fresh_id("x"), **body}
    if bulk:
        refused = await api.answer("POST", f"/v1/tenants/{tenant_id}/bulk", json={"apis": [item]})
        field = f"apis[0].{field}"
    else:
        refused = await api.answer("POST", f"/v1/tenants/{tenant_id}/apis", json=item)
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["field"] == field
    assert await api.apis(tenant_id) == []


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"input_schema": {"type": "object", "properties": {"id": {"type": 7}}}}, "input_schema"),
        ({"input_schema": {"type": "array"}}, "input_schema.type"),
        ({"path_template": "/orders/{order}"}, "path_template"),
        ({"path_template": "orders"}, "path_template"),
        ({"method": "POST"}, "method"),
        ({"output_schema": {"type": "string"}}, "output_schema.type"),
        ({"annotations": {"readOnlyHint": "yes"}}, "annotations.readOnlyHint"),
        ({"name": "has space"}, "name"),
    ],
)
async def test_tools_are_refused_by_the_rules_naming_the_field(api, change, field):
    tenant_id = await api.new_tenant()
    api_id = await api.new_api(tenant_id)
    body = {
        "description": "Get an order",
        "input_schema": SCHEMA,
        "api_id": api_id,
        "method": "GET",
        "path_template": "/orders/{id}",
        **change,
    }
    with pytest.raises(CPError) as refused:
        await api.create_tool(body.pop("name", "get_order"), tenant_id=tenant_id, **body)
    assert refused.value.status_code == 422
    assert refused.value.fields == [field]


async def test_tools_crud_and_the_inventory(api):
    tenant_id, gateway_id, credential, backing = await _mcp_site(api)
    before = await api.generation(gateway_id)
    tool = await api.create_tool(
        "get_order",
        budget={"calls": 5, "window_seconds": 60},
        tenant_id=tenant_id,
        description="Get an order",
        input_schema=SCHEMA,
        api_id=backing,
        method="get",
        path_template="/orders/{id}",
        annotations={"readOnlyHint": True},
    )
    assert tool["method"] == "GET"
    assert await api.generation(gateway_id) == before + 1
    inventory = await api.inventory(gateway_id, credential=credential)
    [shipped] = inventory["tools"]
    assert shipped["name"] == "get_order"
    assert shipped["upstream_url"] == "http://127.0.0.1:9000"
    assert (shipped["budget_calls"], shipped["budget_window_s"]) == (5, 60)
    assert tool["budget"] == {"calls": 5, "window_seconds": 60}
    assert json.loads(shipped["input_schema_json"]) == SCHEMA
    assert [r["kind"] for r in inventory["routes"]] == ["mcp"]
    # PUT replaces the fields: a new generation; the same body again changes nothing.
    body = {k: v for k, v in tool.items() if k not in ("tenant_id", "name")}
    body["description"] = "Read one order"
    updated = await api.update_tool("get_order", body, tenant_id=tenant_id)
    assert updated["description"] == "Read one order"
    after_update = await api.generation(gateway_id)
    assert after_update == before + 2
    await api.update_tool("get_order", body, tenant_id=tenant_id)
    assert await api.generation(gateway_id) == after_update
    with pytest.raises(CPError) as renamed:
        await api.update_tool("get_order", {**body, "name": "other"}, tenant_id=tenant_id)
    assert renamed.value.fields == ["name"]
    with pytest.raises(CPError) as taken:
        await api.create_tool(
            "get_order", tenant_id=tenant_id, **tool_fields(backing, description="x", path_template="/o")
        )
    assert taken.value.status_code == 409
    assert taken.value.fields == ["name"]
    with pytest.raises(CPError) as in_use:
        await api.delete_api(backing, tenant_id=tenant_id)
    assert in_use.value.status_code == 409
    assert in_use.value.fields == ["api_id"]
    assert "get_order" in in_use.value.problem["detail"]
    await api.delete_tool("get_order", tenant_id=tenant_id)
    assert (await api.inventory(gateway_id, credential=credential))["tools"] == []


async def test_tools_of_another_tenant_do_not_exist(api, cp, idp):
    tenant_id = await api.new_tenant()
    other = await api.new_tenant()
    backing = await api.new_api(tenant_id)
    await api.create_tool("t1", tenant_id=tenant_id, **tool_fields(backing))
    token = idp.role_token("tenant_admin", tenant=other)
    async with cp.client(token) as theirs:
        with pytest.raises(CPError) as hidden:
            await theirs.tools(tenant_id)
        assert hidden.value.status_code == 404
        assert hidden.value.fields == ["tenant_id"]
        with pytest.raises(CPError) as not_theirs:
            await theirs.create_tool("t2", tenant_id=other, **tool_fields(backing))
        assert not_theirs.value.status_code == 404
        assert not_theirs.value.fields == ["api_id"]


async def test_grants_revocations_sign_permissions_without_a_generation(signing_cp, key_dir):
    async with signing_cp.client() as client:
        tenant_id = f"t-{uuid.uuid4().hex[:6]}"
        backing = await _setup(client, tenant_id)
        gateway_id = f"gw-{uuid.uuid4().hex[:6]}"
        credential = (await client.create_gateway(gateway_id))["credential"]
        mcp_api = f"mcp-{uuid.uuid4().hex[:6]}"
        await client.create_mcp_api(mcp_api, tenant_id=tenant_id, path_prefix=f"/{mcp_api}")
        await client.create_tool("get_order", tenant_id=tenant_id, **tool_fields(backing))
        await client.deploy(mcp_api, gateway_id)
        seen: list[dict] = []
        async with signing_cp.client(credential) as link:

            async def follow() -> None:
                async with aconnect_sse(link.http, "GET", f"/v1/gateways/{gateway_id}/events") as source:
                    async for event in source.aiter_sse():
                        if event.event == "tool-permissions":
                            seen.append(json.loads(event.data))

            reader = asyncio.create_task(follow())
            try:
                await asyncio.wait_for(_until(lambda: seen), 10)
                first = claims(seen[-1]["jws"])
                assert first["aud"] == gateway_id
                assert first["grants"] == []
                assert first["exp"] - first["iat"] <= 900
                assert header(seen[-1]["jws"])["alg"] == "EdDSA"
                generation = int((await client.gateway(gateway_id))["generation"])
                await client.grant_tool("g1", "get_order", tenant_id=tenant_id, scopes=["tools:read"])
                await asyncio.wait_for(_until(lambda: claims(seen[-1]["jws"])["grants"]), 10)
                granted = claims(seen[-1]["jws"])
                assert granted["seq"] > first["seq"]
                assert granted["grants"][0]["scopes"] == ["tools:read"]
                await client.revoke_tool("r1", "get_order", tenant_id=tenant_id, consumer="bob")
                await asyncio.wait_for(_until(lambda: claims(seen[-1]["jws"])["revocations"]), 10)
                assert claims(seen[-1]["jws"])["revocations"][0]["consumer"] == "bob"
                await client.lift_revocation("r1", tenant_id=tenant_id)
                await asyncio.wait_for(_until(lambda: not claims(seen[-1]["jws"])["revocations"]), 10)
                assert int((await client.gateway(gateway_id))["generation"]) == generation
                seqs = [s["seq"] for s in seen]
                assert seqs == sorted(set(seqs))
                # Rotation: a later key signs from the next round; the JWKS lists both.
                old_kid = header(seen[-1]["jws"])["kid"]
                new_kid = write_key(key_dir / "0002.pem")
                await asyncio.wait_for(_until(lambda: header(seen[-1]["jws"])["kid"] == new_kid), 10)
                async with signing_cp.client() as admin:
                    keys = (await admin.answer("GET", "/v1/tool-permissions/keys")).json()["keys"]
                assert {k["kid"] for k in keys} == {old_kid, new_kid}
            finally:
                reader.cancel()
        async with signing_cp.client() as admin:
            audit = (await admin.answer("GET", "/v1/audit", params={"tenant": tenant_id})).json()
        assert {
            f"POST /v1/tenants/{tenant_id}/tool-grants",
            f"DELETE /v1/tenants/{tenant_id}/tool-revocations/r1",
        } <= {f"{e['method']} {e['path']}" for e in audit}


async def _until(condition) -> None:
    """Until `condition()` holds (callers bound it with a deadline)."""
    await wait_until_async(condition, 10, "the tool permissions to change")


async def test_an_api_change_that_would_leave_a_tool_unfit_is_refused(api):
    """A PUT (or a bulk item) that removes a method a tool calls is 409 naming the tools, and changes
    nothing; a new upstream keeps the tools and takes them, with a new generation, to the gateways of
    the tenant's MCP routes."""
    tenant_id, gateway_id, credential, backing = await _mcp_site(api)
    await api.create_tool(
        "get_order",
        tenant_id=tenant_id,
        **tool_fields(backing, description="Get an order", path_template="/orders/{id}"),
    )
    stored = await api.get_api(backing, tenant_id=tenant_id)
    body = {k: stored[k] for k in ("name", "upstream_url", "path_prefix", "auth")}
    before = await api.generation(gateway_id)
    with pytest.raises(CPError) as refused:
        await api.update_api(backing, {**body, "methods": ["POST"]}, tenant_id=tenant_id)
    assert refused.value.status_code == 409
    assert refused.value.fields == ["methods"]
    assert "get_order (GET)" in refused.value.problem["errors"][0]["message"]
    bulk = {**body, "api_id": backing, "methods": ["POST"]}
    with pytest.raises(CPError) as refused_in_bulk:
        await api.bulk(tenant_id, apis=[bulk])
    assert refused_in_bulk.value.status_code == 409
    assert refused_in_bulk.value.fields == ["apis[0].methods"]
    assert (await api.get_api(backing, tenant_id=tenant_id))["methods"] == ["GET", "POST"]
    assert await api.generation(gateway_id) == before
    # Methods the tools keep, and a new upstream: accepted, and the tool follows it (bulk too).
    await api.update_api(
        backing, {**body, "methods": ["GET"], "upstream_url": "http://127.0.0.1:9001"}, tenant_id=tenant_id
    )
    assert await api.generation(gateway_id) == before + 1
    [tool] = (await api.inventory(gateway_id, credential=credential))["tools"]
    assert tool["upstream_url"] == "http://127.0.0.1:9001"
    await api.bulk(tenant_id, apis=[{**bulk, "methods": ["GET"], "upstream_url": "http://127.0.0.1:9002"}])
    assert await api.generation(gateway_id) == before + 2
    [tool] = (await api.inventory(gateway_id, credential=credential))["tools"]
    assert tool["upstream_url"] == "http://127.0.0.1:9002"
