"""Consumers, API keys, plans and subscriptions on the CP API: tenant-scoped from birth (another
tenant's are 404), keys shown once and stored only as digests, each change a new generation of the
tenant's gateways, delivered in the inventory (digests only), revocations kept; 422 naming the field."""

from __future__ import annotations

import hashlib

import asyncpg
import pytest
from stoa_harness.cp_client import CPError, fresh_id


@pytest.fixture
async def estate(api) -> dict[str, str]:
    tenant = await api.new_tenant()
    gateway, credential = await api.new_gateway()
    api_id = await api.new_api(tenant, auth={"mode": "api_key"})
    await api.deploy(api_id, gateway)
    return {"tenant": tenant, "gateway": gateway, "credential": credential, "api": api_id}


async def test_key_shown_once_stored_as_digest_and_delivered_as_digest(api, estate, cp) -> None:
    tenant, gateway = estate["tenant"], estate["gateway"]
    before = await api.generation(gateway)
    consumer = await api.create_consumer("acme", tenant_id=tenant, client_ids=["acme-app"])
    assert consumer == {
        "consumer_id": "acme",
        "tenant_id": tenant,
        "name": "acme",
        "client_ids": ["acme-app"],
    }
    created = await api.create_key("acme", tenant_id=tenant)
    key = created["key"]
    assert key.startswith(f"stoa_{created['prefix']}_")
    assert len(key) > 40
    assert await api.generation(gateway) == before + 2

    listed = await api.keys("acme", tenant_id=tenant)
    assert [k["prefix"] for k in listed] == [created["prefix"]]
    assert all("key" not in k for k in listed)
    assert key not in str(listed)

    conn = await asyncpg.connect(cp.dsn)
    try:
        dump = await conn.fetch("SELECT * FROM api_keys")
        audit = await conn.fetch("SELECT object_ids::text FROM audit_log")
    finally:
        await conn.close()
    assert key not in str(dump)
    assert key not in str(audit)

    inventory = await api.inventory(gateway, credential=estate["credential"])
    digest = hashlib.sha256(key.encode()).hexdigest()
    assert inventory["consumers"] == [
        {"tenant_id": tenant, "consumer_id": "acme", "client_ids": ["acme-app"], "key_sha256": [digest]}
    ]
    assert key not in str(inventory)
    route = next(r for r in inventory["routes"] if r["route_id"] == estate["api"])
    assert route["auth_mode"] == "api_key"
    assert route["key_header"] == "x-api-key"

    await api.revoke_key("acme", created["key_id"], tenant_id=tenant)
    inventory = await api.inventory(gateway, credential=estate["credential"])
    assert inventory["consumers"][0]["key_sha256"] == []
    assert inventory["revoked_key_sha256"] == [digest]
    with pytest.raises(CPError) as again:
        await api.revoke_key("acme", created["key_id"], tenant_id=tenant)
    assert again.value.status_code == 404
    assert again.value.fields == ["key_id"]
    # A deleted consumer's keys stay revoked.
    other = await api.create_key("acme", tenant_id=tenant)
    await api.delete_consumer("acme", tenant_id=tenant)
    inventory = await api.inventory(gateway, credential=estate["credential"])
    assert inventory["consumers"] == []
    assert hashlib.sha256(other["key"].encode()).hexdigest() in inventory["revoked_key_sha256"]


async def test_plans_and_subscriptions(api, estate) -> None:
    tenant, gateway = estate["tenant"], estate["gateway"]
    await api.create_consumer("c1", tenant_id=tenant)
    plan = await api.create_plan("gold", tenant_id=tenant, requests=10, window_seconds=60, billed=True)
    assert plan == {
        "plan_id": "gold",
        "tenant_id": tenant,
        "requests": 10,
        "window_seconds": 60,
        "billed": True,
    }
    sub = await api.subscribe("s1", tenant_id=tenant, consumer_id="c1", api_id=estate["api"], plan_id="gold")
    assert sub["state"] == "active"
    inventory = await api.inventory(gateway, credential=estate["credential"])
    assert inventory["subscriptions"] == [
        {
            "tenant_id": tenant,
            "subscription_id": "s1",
            "consumer_id": "c1",
            "api_id": estate["api"],
            "plan_id": "gold",
            "active": True,
            "requests": 10,
            "window_seconds": 60,
            "billed": True,
        }
    ]
    before = await api.generation(gateway)
    assert (await api.set_subscription_state("s1", "suspended", tenant_id=tenant))["state"] == "suspended"
    assert await api.generation(gateway) == before + 1
    assert (await api.inventory(gateway, credential=estate["credential"]))["subscriptions"][0][
        "active"
    ] is False

    with pytest.raises(CPError) as in_use:
        await api.delete_plan("gold", tenant_id=tenant)
    assert in_use.value.status_code == 409
    assert in_use.value.fields == ["plan_id"]
    with pytest.raises(CPError) as twice:
        await api.subscribe("s2", tenant_id=tenant, consumer_id="c1", api_id=estate["api"], plan_id="gold")
    assert twice.value.status_code == 409
    assert twice.value.fields == ["api_id"]  # a consumer subscribes once to an API
    with pytest.raises(CPError) as unknown:
        await api.subscribe(
            "s3", tenant_id=tenant, consumer_id="nobody", api_id=estate["api"], plan_id="gold"
        )
    assert unknown.value.status_code == 404
    assert unknown.value.fields == ["consumer_id"]
    response = await api.answer("DELETE", f"/v1/tenants/{tenant}/subscriptions/s1")
    assert response.status_code == 204
    await api.delete_plan("gold", tenant_id=tenant)


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("consumers", {"consumer_id": "c", "name": "c", "client_ids": ["a", "a"]}, "client_ids"),
        ("consumers", {"consumer_id": "bad id", "name": "c"}, "consumer_id"),
        ("plans", {"plan_id": "p", "requests": 0, "window_seconds": 60}, "requests"),
        ("plans", {"plan_id": "p", "requests": 1, "window_seconds": 0}, "window_seconds"),
        ("subscriptions", {"subscription_id": "s", "consumer_id": "c", "api_id": "a"}, "plan_id"),
    ],
)
async def test_bad_input_is_422_naming_the_field(api, estate, path: str, body: dict, field: str) -> None:
    response = await api.answer("POST", f"/v1/tenants/{estate['tenant']}/{path}", json=body)
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]


@pytest.mark.parametrize(
    ("auth", "field"),
    [
        ({"mode": "api_key", "key_header": "authorization"}, "auth.key_header"),
        ({"mode": "api_key", "key_header": "x-stoa-key"}, "auth.key_header"),
        ({"mode": "jwt", "key_header": "x-key"}, "auth.key_header"),
        ({"mode": "api_key", "subscription": True}, "auth.subscription"),
    ],
)
async def test_api_auth_fields_of_another_mode_are_422(api, estate, auth: dict, field: str) -> None:
    body = {"api_id": fresh_id("a"), "name": "a", "upstream_url": "http://127.0.0.1:9", "methods": ["GET"]}
    response = await api.answer("POST", f"/v1/tenants/{estate['tenant']}/apis", json={**body, "auth": auth})
    assert response.status_code == 422, response.text
    assert [e["field"] for e in response.json()["errors"]] == [field]
    # The same rule when APIs are written in bulk.
    bulk = await api.answer(
        "POST", f"/v1/tenants/{estate['tenant']}/bulk", json={"apis": [{**body, "auth": auth}]}
    )
    assert bulk.status_code == 422, bulk.text
    assert [e["field"] for e in bulk.json()["errors"]] == [f"apis[0].{field}"]


async def test_client_id_maps_to_one_consumer(api, estate) -> None:
    tenant = estate["tenant"]
    await api.create_consumer("one", tenant_id=tenant, client_ids=["app"])
    with pytest.raises(CPError) as taken:
        await api.create_consumer("two", tenant_id=tenant, client_ids=["app"])
    assert taken.value.status_code == 409
    assert taken.value.fields == ["client_ids"]
    # The refused create changed nothing.
    listed = (await api.answer("GET", f"/v1/tenants/{tenant}/consumers")).json()
    assert [c["consumer_id"] for c in listed] == ["one"]
    # Another tenant may use the same client id.
    other = await api.new_tenant()
    await api.create_consumer("two", tenant_id=other, client_ids=["app"])


async def test_another_tenants_admin_gets_404(api, estate, idp, cp) -> None:
    tenant = estate["tenant"]
    await api.create_consumer("mine", tenant_id=tenant)
    await api.create_plan("p", tenant_id=tenant, requests=1, window_seconds=1)
    stranger = idp.role_token("tenant_admin", tenant=await api.new_tenant())
    async with cp.client(stranger) as client:
        for method, path in (
            ("GET", f"/v1/tenants/{tenant}/consumers/mine"),
            ("POST", f"/v1/tenants/{tenant}/consumers/mine/keys"),
            ("DELETE", f"/v1/tenants/{tenant}/plans/p"),
            ("GET", f"/v1/tenants/{tenant}/subscriptions"),
        ):
            response = await client.answer(method, path)
            assert response.status_code == 404, (method, path, response.text)
    own = idp.role_token("tenant_admin", tenant=tenant)
    async with cp.client(own) as client:
        assert (await client.answer("POST", f"/v1/tenants/{tenant}/consumers/mine/keys")).status_code == 201


async def test_ids_are_unique_within_their_tenant_and_deletes_are_204(api, estate) -> None:
    tenant, gateway = estate["tenant"], estate["gateway"]
    base = f"/v1/tenants/{tenant}"
    for path, body in (
        ("consumers", {"consumer_id": "c", "name": "C"}),
        ("consumers", {"consumer_id": "c2", "name": "C2"}),
        ("plans", {"plan_id": "p", "requests": 5, "window_seconds": 60}),
        (
            "subscriptions",
            {"subscription_id": "s", "consumer_id": "c", "api_id": estate["api"], "plan_id": "p"},
        ),
    ):
        created = await api.answer("POST", f"{base}/{path}", json=body)
        assert created.status_code == 201, created.text
        assert {k: created.json()[k] for k in body} == body
    for path, body, field in (
        ("consumers", {"consumer_id": "c", "name": "again"}, "consumer_id"),
        ("plans", {"plan_id": "p", "requests": 1, "window_seconds": 1}, "plan_id"),
        (
            "subscriptions",
            {"subscription_id": "s", "consumer_id": "c2", "api_id": estate["api"], "plan_id": "p"},
            "subscription_id",
        ),
    ):
        clash = await api.answer("POST", f"{base}/{path}", json=body)
        assert clash.status_code == 409, clash.text
        assert [e["field"] for e in clash.json()["errors"]] == [field]
    assert [c["name"] for c in (await api.answer("GET", f"{base}/consumers")).json()] == ["C", "C2"]
    # Another tenant has its own ids.
    other = await api.new_tenant()
    await api.create_consumer("c", tenant_id=other)
    await api.create_plan("p", tenant_id=other, requests=1, window_seconds=1)

    # A plan's new figures reach the site with the subscriptions using it: a new generation.
    before = await api.generation(gateway)
    updated = await api.answer(
        "PUT", f"{base}/plans/p", json={"requests": 7, "window_seconds": 30, "billed": True}
    )
    assert updated.status_code == 200, updated.text
    assert await api.generation(gateway) == before + 1
    [delivered] = (await api.inventory(gateway, credential=estate["credential"]))["subscriptions"]
    assert (delivered["requests"], delivered["window_seconds"], delivered["billed"]) == (7, 30, True)

    key = await api.create_key("c", tenant_id=tenant)
    for path in (f"consumers/c/keys/{key['key_id']}", "subscriptions/s", "plans/p", "consumers/c"):
        deleted = await api.answer("DELETE", f"{base}/{path}")
        assert deleted.status_code == 204, (path, deleted.text)
        assert deleted.content == b""
    assert (await api.answer("GET", f"{base}/consumers/c")).status_code == 404


async def test_viewers_only_read_and_every_write_is_audited_by_id(api, estate, idp, cp) -> None:
    tenant = estate["tenant"]
    base = f"/v1/tenants/{tenant}"
    async with cp.client(idp.role_token("tenant_admin", tenant=tenant, sub="carol")) as admin:
        assert (
            await admin.answer("POST", f"{base}/consumers", json={"consumer_id": "a", "name": "A"})
        ).status_code == 201
        key = (await admin.answer("POST", f"{base}/consumers/a/keys")).json()
        plan = await admin.answer(
            "POST", f"{base}/plans", json={"plan_id": "p", "requests": 1, "window_seconds": 1}
        )
        assert plan.status_code == 201
        entries = (await admin.answer("GET", "/v1/audit")).json()
    async with cp.client(idp.role_token("viewer", tenant=tenant)) as viewer:
        assert [c["consumer_id"] for c in (await viewer.answer("GET", f"{base}/consumers")).json()] == ["a"]
        assert [k["key_id"] for k in (await viewer.answer("GET", f"{base}/consumers/a/keys")).json()] == [
            key["key_id"]
        ]
        for method, path in (
            ("POST", f"{base}/consumers/a/keys"),
            ("DELETE", f"{base}/consumers/a/keys/{key['key_id']}"),
            ("DELETE", f"{base}/plans/p"),
            ("PUT", f"{base}/plans/p"),
        ):
            refused = await viewer.answer(method, path, json={"requests": 9, "window_seconds": 9})
            assert refused.status_code == 403, (method, path, refused.text)
    # Nothing a viewer was refused happened.
    assert [k["revoked_at"] for k in await api.keys("a", tenant_id=tenant)] == [None]
    assert (await api.answer("GET", f"{base}/plans/p")).json()["requests"] == 1
    mine = [e for e in reversed(entries) if e["subject"] == "carol"]  # newest first
    assert [(e["method"], e["path"], e["status"]) for e in mine[-3:]] == [
        ("POST", f"{base}/consumers", 201),
        ("POST", f"{base}/consumers/a/keys", 201),
        ("POST", f"{base}/plans", 201),
    ]
    assert mine[-2]["object_ids"] == {"tenant_id": tenant, "consumer_id": "a", "key_id": key["key_id"]}
    assert mine[-2]["tenant_id"] == tenant
    assert key["key"] not in str(entries)
