"""Bulk publication and the CP's bounds: many APIs and deployments in one generation, all or nothing,
validated item by item as the single calls are; request bodies and per-tenant counts bounded, each
refusal naming its limit."""

from __future__ import annotations

import asyncpg
import httpx
from stoa_harness.cp_client import fresh_id

PROBLEM = "application/problem+json"


def fields(response: httpx.Response) -> list[str]:
    assert response.headers["content-type"].startswith(PROBLEM), response.text
    return [error["field"] for error in response.json()["errors"]]


def api_body(api_id: str, **extra: object) -> dict[str, object]:
    return {
        "api_id": api_id,
        "name": api_id,
        "upstream_url": "http://127.0.0.1:9000",
        "methods": ["GET"],
        **extra,
    }


async def test_bulk_publishes_many_apis_in_one_generation_and_a_replay_changes_nothing(api) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    before = await api.generation(gateway_id)
    ids = [fresh_id("b") for _ in range(50)]
    body = {"apis": [api_body(a) for a in ids], "deploy": [{"gateway_id": gateway_id, "api_ids": ids}]}
    response = await api.answer("POST", f"/v1/tenants/{tenant_id}/bulk", json=body)
    assert response.status_code == 200, response.text
    out = response.json()
    assert sorted(out["created"]) == sorted(ids)
    assert out["changed"] == [gateway_id]
    assert out["generations"] == {gateway_id: before + 1}
    inventory = await api.inventory(gateway_id, credential=credential)
    assert inventory["generation"] == str(before + 1)
    assert sorted(r["route_id"] for r in inventory["routes"]) == sorted(ids)

    replay = await api.answer("POST", f"/v1/tenants/{tenant_id}/bulk", json=body)
    assert replay.status_code == 200, replay.text
    assert (replay.json()["created"], replay.json()["changed"]) == ([], [])
    assert await api.generation(gateway_id) == before + 1

    # An edit of deployed APIs and an undeployment: one more generation, tombstones for the removed.
    edited = {
        "apis": [api_body(ids[0], methods=["GET", "POST"])],
        "undeploy": [{"gateway_id": gateway_id, "api_ids": ids[1:3]}],
    }
    response = await api.answer("POST", f"/v1/tenants/{tenant_id}/bulk", json=edited)
    assert response.status_code == 200, response.text
    assert response.json()["updated"] == [ids[0]]
    assert await api.generation(gateway_id) == before + 2
    inventory = await api.inventory(gateway_id, credential=credential)
    assert sorted(t["route_id"] for t in inventory["tombstones"]) == sorted(ids[1:3])
    assert next(r for r in inventory["routes"] if r["route_id"] == ids[0])["methods"] == ["GET", "POST"]


async def test_a_large_import_leaves_the_tables_analyzed(cp_factory, monkeypatch) -> None:
    # Until a table is analyzed, the planner finds a generation's changed routes by walking every
    # deployment of the gateway: an import gives statistics of what it wrote (a smaller bar here).
    monkeypatch.setattr("stoa_cp.store.bulk.ANALYZE_ROWS", 40)
    cp = await cp_factory()
    async with cp.client() as api:
        tenant_id = await api.new_tenant()
        gateway_id, _ = await api.new_gateway()
        ids = [fresh_id("s") for _ in range(20)]
        body = {"apis": [api_body(a) for a in ids], "deploy": [{"gateway_id": gateway_id, "api_ids": ids}]}
        response = await api.answer("POST", f"/v1/tenants/{tenant_id}/bulk", json=body)
        assert response.status_code == 200, response.text
    conn = await asyncpg.connect(cp.dsn)
    try:
        counted = "SELECT relname, reltuples FROM pg_class WHERE relname = ANY($1::text[])"
        assert dict(await conn.fetch(counted, ["apis", "deployments"])) == {"apis": 20, "deployments": 20}
    finally:
        await conn.close()


async def test_a_large_import_is_kept_when_its_tables_cannot_be_analyzed(cp_factory, monkeypatch) -> None:
    # The analysis is an afterthought of the committed import: another session holding the table
    # (a manual VACUUM, an index build, another import's analysis) leaves it to autovacuum.
    monkeypatch.setattr("stoa_cp.store.bulk.ANALYZE_ROWS", 10)
    cp = await cp_factory()
    holder = await asyncpg.connect(cp.dsn)
    try:
        async with cp.client() as api:
            tenant_id = await api.new_tenant()
            gateway_id, credential = await api.new_gateway()
            ids = [fresh_id("h") for _ in range(10)]
            deploy = [{"gateway_id": gateway_id, "api_ids": ids}]
            body = {"apis": [api_body(a) for a in ids], "deploy": deploy}
            transaction = holder.transaction()
            await transaction.start()
            await holder.execute("LOCK TABLE deployments IN SHARE UPDATE EXCLUSIVE MODE")
            response = await api.answer("POST", f"/v1/tenants/{tenant_id}/bulk", json=body)
            await transaction.rollback()
            assert response.status_code == 200, response.text
            inventory = await api.inventory(gateway_id, credential=credential)
            assert sorted(r["route_id"] for r in inventory["routes"]) == sorted(ids)
    finally:
        await holder.close()


async def test_a_refused_item_stores_nothing_and_is_named(api) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, _ = await api.new_gateway()
    taken = await api.new_api(tenant_id)
    before = await api.generation(gateway_id)
    fresh = [fresh_id("b") for _ in range(3)]
    url = f"/v1/tenants/{tenant_id}/bulk"
    cases = [
        (
            {"apis": [api_body(fresh[0]), api_body(fresh[1], upstream_url="ftp://x/y")]},
            422,
            ["apis[1].upstream_url"],
        ),
        (
            {"apis": [api_body(fresh[0]), api_body(fresh[1], path_prefix=f"/apis/{taken}")]},
            409,
            ["apis[1].path_prefix"],
        ),
        (
            {"apis": [api_body(fresh[0]), api_body(fresh[0], path_prefix="/other")]},
            422,
            ["apis[0].api_id", "apis[1].api_id"],
        ),
        (
            {
                "apis": [api_body(fresh[0])],
                "deploy": [{"gateway_id": gateway_id, "api_ids": [fresh[0], "nope"]}],
            },
            404,
            ["deploy[0].api_ids[1]"],
        ),
        (
            {"apis": [api_body(fresh[0])], "deploy": [{"gateway_id": "no-gw", "api_ids": [fresh[0]]}]},
            404,
            ["deploy[0].gateway_id"],
        ),
        ({"undeploy": [{"gateway_id": gateway_id, "api_ids": [taken]}]}, 404, ["undeploy[0].api_ids[0]"]),
    ]
    for body, status, named in cases:
        response = await api.answer("POST", url, json=body)
        assert response.status_code == status, (body, response.text)
        assert fields(response) == named, response.text
    listed = (await api.answer("GET", f"/v1/tenants/{tenant_id}/apis")).json()
    assert [a["api_id"] for a in listed] == [taken]
    assert await api.generation(gateway_id) == before
    other = await api.new_tenant()
    foreign = await api.answer("POST", f"/v1/tenants/{other}/bulk", json={"apis": [api_body(taken)]})
    assert foreign.status_code == 409, foreign.text
    assert fields(foreign) == ["apis[0].api_id"]


async def test_bodies_and_counts_are_bounded_and_each_refusal_names_its_limit(cp_factory) -> None:
    limited = await cp_factory(
        max_body_bytes=4096, bulk_max_body_bytes=16384, bulk_max_items=40, max_routes_per_tenant=30
    )
    async with limited.client() as admin:
        assert (
            await admin.answer("POST", "/v1/tenants", json={"tenant_id": "t", "name": "T"})
        ).status_code == 201
        big = {"tenant_id": "u", "name": "x" * 5000}
        declared = await admin.answer("POST", "/v1/tenants", json=big)
        assert declared.status_code == 413, declared.text
        assert "max_body_bytes" in declared.json()["errors"][0]["message"]

        async def chunks():  # no Content-Length: the bytes are counted as they arrive
            yield b'{"tenant_id": "u", "name": "'
            for _ in range(100):
                yield b"x" * 100
            yield b'"}'

        streamed = await admin.answer(
            "POST", "/v1/tenants", content=chunks(), headers={"content-type": "application/json"}
        )
        assert streamed.status_code == 413, streamed.text
        assert "max_body_bytes" in streamed.json()["errors"][0]["message"]

        # The bulk endpoint takes a larger body than any other call, and has its own bound.
        ids = [f"a{i}" for i in range(30)]
        bulk = await admin.answer(
            "POST", "/v1/tenants/t/bulk", json={"apis": [api_body(a, name=a * 40) for a in ids]}
        )
        assert bulk.status_code == 200, bulk.text
        assert len(bulk.request.content) > 4096
        huge = await admin.answer(
            "POST",
            "/v1/tenants/t/bulk",
            json={"apis": [api_body(f"b{i}", name="n" * 900) for i in range(20)]},
        )
        assert huge.status_code == 413, huge.text
        assert "bulk_max_body_bytes" in huge.text
        over = await admin.answer(
            "POST", "/v1/tenants/t/bulk", json={"apis": [api_body(f"c{i}") for i in range(41)]}
        )
        assert over.status_code == 422, over.text
        assert "bulk_max_items" in over.text

        # 30 APIs is the tenant's limit: one more is refused whichever way it comes.
        one = await admin.answer("POST", "/v1/tenants/t/apis", json=api_body("one-more"))
        assert one.status_code == 422, one.text
        assert "max_routes_per_tenant" in one.text
        more = await admin.answer("POST", "/v1/tenants/t/bulk", json={"apis": [api_body("one-more")]})
        assert more.status_code == 422, more.text
        assert fields(more) == ["apis"]
        assert "max_routes_per_tenant" in more.text
        assert len((await admin.answer("GET", "/v1/tenants/t/apis")).json()) == 30


async def test_policy_lists_are_bounded_and_the_refusal_names_the_list_and_its_limit(cp_factory) -> None:
    limited = await cp_factory(policy_max_origins=2, policy_max_headers=2, policy_max_addresses=3)
    async with limited.client() as admin:
        assert (
            await admin.answer("POST", "/v1/tenants", json={"tenant_id": "t", "name": "T"})
        ).status_code == 201
        origins = [f"https://{n}.example.com" for n in "abc"]
        cases = [
            ("cors", {"allowedOrigins": origins}, "config.allowedOrigins", "policy_max_origins"),
            (
                "cors",
                {"allowedOrigins": origins[:1], "allowedHeaders": ["a", "b", "c"]},
                "config.allowedHeaders",
                "policy_max_headers",
            ),
            (
                "ip_filter",
                {"mode": "deny", "ip_list": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]},
                "config.ip_list",
                "policy_max_addresses",
            ),
        ]
        for i, (kind, config, field, setting) in enumerate(cases):
            body = {"policy_id": f"p{i}", "type": kind, "config": config, "scope": "tenant"}
            response = await admin.answer("POST", "/v1/tenants/t/policies", json=body)
            assert response.status_code == 422, response.text
            assert fields(response) == [field]
            assert setting in response.json()["errors"][0]["message"]
        at_limit = {
            "policy_id": "ok",
            "type": "cors",
            "config": {"allowedOrigins": origins[:2]},
            "scope": "tenant",
        }
        assert (await admin.answer("POST", "/v1/tenants/t/policies", json=at_limit)).status_code == 201
        assert [p["policy_id"] for p in (await admin.answer("GET", "/v1/tenants/t/policies")).json()] == [
            "ok"
        ]


async def test_a_write_past_its_lock_bound_is_a_503_and_stores_nothing(cp_factory) -> None:
    # A table held by another session past the statement bound: the transaction's connection is
    # closed (its state unknown) and the client gets the 503 with Retry-After, never a 500.
    cp = await cp_factory(db_statement_timeout_s=0.5)
    holder = await asyncpg.connect(cp.dsn)
    try:
        async with cp.client() as api:
            tenant_id = await api.new_tenant()
            api_id = fresh_id("l")
            transaction = holder.transaction()
            await transaction.start()
            await holder.execute("LOCK TABLE apis IN ACCESS EXCLUSIVE MODE")
            response = await api.answer("POST", f"/v1/tenants/{tenant_id}/apis", json=api_body(api_id))
            await transaction.rollback()
            assert response.status_code == 503, response.text
            assert int(response.headers["retry-after"]) >= 1
            listed = await api.answer("GET", f"/v1/tenants/{tenant_id}/apis")
            assert api_id not in [a["api_id"] for a in listed.json()]
    finally:
        await holder.close()
