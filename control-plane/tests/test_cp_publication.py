"""Publication model: generations bump exactly once per change of a gateway's desired state (and only
for gateways it changes), tombstones, inventory content, and the sync status state machine."""

from __future__ import annotations

import asyncio
import json

from google.protobuf import json_format
from stoa_harness.cp_client import fresh_id
from stoa_proto import inventory_pb2


async def test_deploy_undeploy_redeploy_generations_and_tombstones(api) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    bystander, _ = await api.new_gateway()
    api_id = await api.new_api(
        tenant_id, methods=["GET", "POST"], timeout_ms=1200, auth={"mode": "jwt", "scopes": ["orders:read"]}
    )
    assert await api.generations(gateway_id, bystander) == [1, 1]

    assert await api.deploy(api_id, gateway_id) == 2
    again = await api.answer("PUT", f"/v1/gateways/{gateway_id}/deployments/{api_id}")
    assert again.json() == {"gateway_id": gateway_id, "api_id": api_id, "generation": 2, "changed": False}
    inv = await api.inventory(gateway_id, credential=credential)
    assert inv["generation"] == "2"
    assert inv["routes"] == [
        {
            "route_id": api_id,
            "tenant_id": tenant_id,
            "api_id": api_id,
            "path_prefix": f"/apis/{api_id}",
            "methods": ["GET", "POST"],
            "upstream_url": "http://127.0.0.1:9000",
            "timeout_ms": 1200,
            "auth_mode": "jwt",
            "scopes": ["orders:read"],
            "forward_credential": False,
            "envelope": False,
            "kind": "",
            "key_header": "",
            "subscription": False,
        }
    ]
    assert inv["tombstones"] == []

    undeployed = await api.answer("DELETE", f"/v1/gateways/{gateway_id}/deployments/{api_id}")
    assert undeployed.status_code == 200
    assert undeployed.json()["generation"] == 3
    inv = await api.inventory(gateway_id, credential=credential)
    assert inv["routes"] == []
    assert inv["tombstones"] == [{"route_id": api_id, "generation": "3"}]
    missing = await api.answer("DELETE", f"/v1/gateways/{gateway_id}/deployments/{api_id}")
    assert missing.status_code == 404
    assert [e["field"] for e in missing.json()["errors"]] == ["api_id"]
    assert await api.generation(gateway_id) == 3

    assert await api.deploy(api_id, gateway_id) == 4
    inv = await api.inventory(gateway_id, credential=credential)
    assert [r["route_id"] for r in inv["routes"]] == [api_id]
    assert inv["tombstones"] == []  # a re-deploy removes the tombstone
    assert await api.generation(bystander) == 1


async def test_deploy_errors_name_the_field_and_change_nothing(api) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, _ = await api.new_gateway()
    api_id = await api.new_api(tenant_id)
    unknown_api = await api.answer("PUT", f"/v1/gateways/{gateway_id}/deployments/nope")
    assert unknown_api.status_code == 404
    assert unknown_api.json()["errors"][0]["field"] == "api_id"
    unknown_gw = await api.answer("PUT", f"/v1/gateways/nope/deployments/{api_id}")
    assert unknown_gw.status_code == 404
    assert unknown_gw.json()["errors"][0]["field"] == "gateway_id"
    assert await api.generation(gateway_id) == 1


async def test_api_edit_bumps_only_the_gateways_it_is_deployed_on(api) -> None:
    tenant_id = await api.new_tenant()
    g1, c1 = await api.new_gateway()
    g2, _ = await api.new_gateway()
    g3, _ = await api.new_gateway()
    api_id = await api.new_api(tenant_id)
    other_api = await api.new_api(tenant_id)
    await api.deploy(api_id, g1)
    await api.deploy(api_id, g2)
    await api.deploy(other_api, g3)
    before = await api.generations(g1, g2, g3)

    same = {"name": "API", "upstream_url": "http://127.0.0.1:9000", "methods": ["GET"]}
    assert (await api.answer("PUT", f"/v1/tenants/{tenant_id}/apis/{api_id}", json=same)).status_code == 200
    assert await api.generations(g1, g2, g3) == before  # identical content: no change, no bump

    edited = {**same, "upstream_url": "http://127.0.0.1:9100"}
    assert (await api.answer("PUT", f"/v1/tenants/{tenant_id}/apis/{api_id}", json=edited)).status_code == 200
    assert await api.generations(g1, g2, g3) == [before[0] + 1, before[1] + 1, before[2]]
    inv = await api.inventory(g1, credential=c1)
    assert inv["routes"][0]["upstream_url"] == "http://127.0.0.1:9100"

    bad = {**same, "upstream_url": "gopher://x"}
    assert (await api.answer("PUT", f"/v1/tenants/{tenant_id}/apis/{api_id}", json=bad)).status_code == 422
    assert await api.generations(g1, g2, g3) == [before[0] + 1, before[1] + 1, before[2]]


async def test_api_delete_tombstones_it_on_every_gateway(api) -> None:
    tenant_id = await api.new_tenant()
    gateways = [await api.new_gateway() for _ in range(3)]
    api_id = await api.new_api(tenant_id)
    keep = await api.new_api(tenant_id)
    for gateway_id, _ in gateways[:2]:
        await api.deploy(api_id, gateway_id)
        await api.deploy(keep, gateway_id)
    await api.deploy(keep, gateways[2][0])
    before = await api.generations(*(g for g, _ in gateways))

    assert (await api.answer("DELETE", f"/v1/tenants/{tenant_id}/apis/{api_id}")).status_code == 204
    after = await api.generations(*(g for g, _ in gateways))
    assert after == [before[0] + 1, before[1] + 1, before[2]]
    for (gateway_id, credential), generation in zip(gateways[:2], after[:2], strict=True):
        inv = await api.inventory(gateway_id, credential=credential)
        assert [r["route_id"] for r in inv["routes"]] == [keep]
        assert inv["tombstones"] == [{"route_id": api_id, "generation": str(generation)}]
    third = await api.inventory(gateways[2][0], credential=gateways[2][1])
    assert third["tombstones"] == []


async def report(cp, path_gateway: str, credential: str, **fields) -> object:
    body = {"gateway_id": path_gateway, **fields}
    async with cp.client(credential) as client:
        return await client.answer("POST", f"/v1/gateways/{path_gateway}/sync-reports", json=body)


async def status(api, gateway_id: str) -> dict:
    return await api.status(gateway_id)


async def test_status_is_always_about_the_desired_generation(api, cp) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    first = await status(api, gateway_id)
    assert first == {
        "gateway_id": gateway_id,
        "desired_generation": 1,
        "acknowledged_generation": 0,
        "snapshot_version": "",
        "state": "PENDING",
        "last_report": None,
        "invalid_policies": [],
    }

    ok = await report(cp, gateway_id, credential, generation="1", status="SYNCED", snapshot_version="v1")
    assert ok.status_code == 202, ok.text
    assert (await status(api, gateway_id))["state"] == "SYNCED"

    api_id = await api.new_api(tenant_id)
    await api.deploy(api_id, gateway_id)  # generation 2
    current = await status(api, gateway_id)
    assert (current["state"], current["desired_generation"], current["acknowledged_generation"]) == (
        "PENDING",
        2,
        1,
    )

    # A late report about generation 1 never makes generation 2 SYNCED.
    await report(cp, gateway_id, credential, generation=1, status="SYNCED", snapshot_version="v1")
    assert (await status(api, gateway_id))["state"] == "PENDING"
    # A failure about an older generation does not fail the desired one either.
    await report(
        cp, gateway_id, credential, generation=1, status="FAILED", reason="STALE_GENERATION", detail="old"
    )
    assert (await status(api, gateway_id))["state"] == "PENDING"

    failed = await report(
        cp, gateway_id, credential, generation=2, status="FAILED", reason="NACK", detail="envoy said no"
    )
    assert failed.status_code == 202
    current = await status(api, gateway_id)
    assert current["state"] == "FAILED"
    assert current["last_report"] == {
        "generation": 2,
        "status": "FAILED",
        "reason": "NACK",
        "detail": "envoy said no",
    }

    await report(cp, gateway_id, credential, generation=2, status="SYNCED", snapshot_version="v2")
    current = await status(api, gateway_id)
    assert (current["state"], current["acknowledged_generation"], current["snapshot_version"]) == (
        "SYNCED",
        2,
        "v2",
    )
    # acknowledged_generation never goes back
    await report(cp, gateway_id, credential, generation=1, status="SYNCED", snapshot_version="v1")
    assert (await status(api, gateway_id))["snapshot_version"] == "v2"


async def test_bad_sync_reports_are_422_and_change_nothing(api, cp) -> None:
    gateway_id, credential = await api.new_gateway()
    other_id, _ = await api.new_gateway()
    cases = [
        ({"generation": 1, "status": "SYNCED"}, "snapshot_version"),
        ({"generation": 1, "status": "FAILED"}, "reason"),
        ({"generation": 1, "status": "SYNC_STATUS_UNSPECIFIED"}, "status"),
        ({"generation": 1, "status": "MAYBE"}, "body"),
        ({"generation": 0, "status": "SYNCED", "snapshot_version": "v"}, "generation"),
        (
            {"generation": 1, "status": "SYNCED", "snapshot_version": "v", "gateway_id": other_id},
            "gateway_id",
        ),
        ({"generation": 1, "status": "SYNCED", "snapshot_version": "v", "extra": 1}, "body"),
        ({"generation": 1, "status": "FAILED", "reason": "NACK", "detail": "a\u0000b"}, "detail"),
    ]
    for fields, field in cases:
        response = await report(cp, gateway_id, credential, **fields)
        assert response.status_code == 422, (fields, response.text)
        assert [e["field"] for e in response.json()["errors"]] == [field], fields
    current = await status(api, gateway_id)
    assert current["last_report"] is None
    assert current["state"] == "PENDING"


async def test_concurrent_changes_each_get_their_own_generation(api) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    apis = [await api.new_api(tenant_id) for _ in range(12)]
    policy = {
        "policy_id": fresh_id("p"),
        "type": "rate_limit",
        "scope": "tenant",
        "config": {"maxRequests": 1, "intervalSeconds": 1},
    }
    responses = await asyncio.gather(
        *(api.answer("PUT", f"/v1/gateways/{gateway_id}/deployments/{a}") for a in apis),
        api.answer("POST", f"/v1/tenants/{tenant_id}/policies", json=policy),
    )
    assert [r.status_code for r in responses] == [200] * len(apis) + [201]
    generations = sorted(r.json()["generation"] for r in responses[:-1])
    assert len(set(generations)) == len(apis)
    # No generation skipped or shared: each deploy has its own, and the policy one more only when it
    # came after a route of the tenant was on the gateway (before that it does not concern it).
    final = await api.generation(gateway_id)
    policy_generations = set(range(2, final + 1)) - set(generations)
    assert min(generations) >= 2
    assert max(generations) <= final
    assert len(policy_generations) <= 1, (generations, final)  # one change, at most one generation
    assert all(g > generations[0] for g in policy_generations), (generations, final)
    inv = await api.inventory(gateway_id, credential=credential)
    assert inv["generation"] == str(final)
    assert sorted(r["route_id"] for r in inv["routes"]) == sorted(apis)
    assert [p["policy_id"] for p in inv["policies"]] == [policy["policy_id"]]


async def test_config_document_is_exactly_what_json_format_writes_for_it(api, cp) -> None:
    # The large lists are written by PostgreSQL: the bytes must still be json_format's (field order
    # with defaults last, int64 as strings, empty lists present), with set and unset fields mixed.
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    full = await api.new_api(
        tenant_id,
        methods=["GET", "POST"],
        timeout_ms=1200,
        auth={"mode": "jwt", "scopes": ["a:b"], "forward_credential": True},
    )
    bare = await api.new_api(tenant_id, auth={"mode": "none", "scopes": []})  # timeout 0, no scopes
    gone = await api.new_api(tenant_id)
    for api_id in (full, bare, gone):
        await api.deploy(api_id, gateway_id)
    await api.undeploy(gone, gateway_id)
    async with cp.client(credential) as client:
        body = (await client.answer("GET", f"/v1/gateways/{gateway_id}/config")).text
    parsed = json_format.Parse(body, inventory_pb2.Inventory())
    assert [r.route_id for r in parsed.routes] == sorted([full, bare])
    assert [t.route_id for t in parsed.tombstones] == [gone]
    rewritten = json_format.MessageToDict(
        parsed, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    assert body == json.dumps(rewritten, separators=(",", ":"))


async def test_a_link_ahead_of_the_cp_moves_the_gateway_generation_above_it(api, cp, caplog) -> None:
    """A database restored from a backup is behind what the Link applied: its resume id (or a sync
    report) names a generation above the CP's. The CP moves the gateway above it, so the next
    inventory is newer than the Link's and accepted rather than refused as stale."""
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    assert await api.generation(gateway_id) == 1
    headers = {"last-event-id": "50"}
    async with (
        cp.client(credential) as client,
        client.http.stream("GET", f"/v1/gateways/{gateway_id}/events", headers=headers) as response,
    ):
        assert response.status_code == 200
        lines = response.aiter_lines()
        event_id = await asyncio.wait_for(anext(_ids(lines)), 10)
    assert event_id == "51"
    assert await api.generation(gateway_id) == 51
    moved = [r.getMessage() for r in caplog.records if "generation_moved" in r.getMessage()]
    assert any(f"gateway={gateway_id} from=1 to=51" in m and "Last-Event-ID" in m for m in moved), moved
    api_id = await api.new_api(tenant_id)
    assert await api.deploy(api_id, gateway_id) == 52

    response = await report(cp, gateway_id, credential, generation=80, status="SYNCED", snapshot_version="v")
    assert response.status_code == 202, response.text
    assert response.json()["desired_generation"] == 81
    assert response.json()["state"] == "PENDING"
    assert await api.generation(gateway_id) == 81


async def _ids(lines):  # the `id:` of each event of an SSE stream
    async for line in lines:
        if line.startswith("id:"):
            yield line.removeprefix("id:").strip()
