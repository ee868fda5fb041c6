"""SSE deltas (?deltas=true): each event is what changed since the previous generation, made of the
inventory's own messages; applied to the previous complete inventory it gives GET /config exactly,
and it carries the content hash of that complete inventory."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from google.protobuf import json_format
from httpx_sse import ServerSentEvent, aconnect_sse
from joserfc.jwk import OKPKey
from stoa_harness.cp_client import fresh_id
from stoa_proto import inventory_pb2
from stoa_proto.inventory_delta import Elements, inventory_hash


def _jwks(kid: str) -> dict:
    return {"keys": [{**OKPKey.generate_key("Ed25519").as_dict(private=False), "kid": kid}]}


class DeltaReader:
    """Follows a delta stream as a Link does, applying each delta to the last complete inventory."""

    def __init__(self, events: AsyncIterator[ServerSentEvent]) -> None:
        self.events = events
        self.held: Elements | None = None

    async def next(self) -> tuple[str, str, str]:
        async for sse in self.events:
            if sse.data:  # a frame without data is not an event (httpx_sse yields it; a Link skips it)
                return sse.event, sse.id, sse.data
        raise AssertionError("stream ended")

    async def follow(self) -> tuple[str, int, int]:
        """Read one event and apply it: (event, generation, bytes)."""
        event, event_id, data = await self.next()
        if event == "inventory":
            self.held = Elements.of(json_format.Parse(data, inventory_pb2.Inventory()))
        else:
            assert event == "delta"
            assert self.held is not None
            delta = json_format.Parse(data, inventory_pb2.InventoryDelta())
            self.held.apply(delta)  # raises unless it applies to the held generation and reaches its hash
        assert str(self.held.generation) == event_id
        return event, self.held.generation, len(data)


@contextlib.asynccontextmanager
async def delta_stream(
    cp, gateway_id: str, credential: str, last_id: str | None = None
) -> AsyncIterator[DeltaReader]:
    headers = {"last-event-id": last_id} if last_id is not None else {}
    path = f"/v1/gateways/{gateway_id}/events?deltas=true"
    async with (
        cp.client(credential, timeout=30) as client,
        aconnect_sse(client.http, "GET", path, headers=headers) as source,
    ):
        assert source.response.status_code == 200
        yield DeltaReader(source.aiter_sse())


async def _config(cp, gateway_id: str, credential: str) -> inventory_pb2.Inventory:
    async with cp.client(credential) as link:
        response = await link.answer("GET", f"/v1/gateways/{gateway_id}/config")
    return json_format.Parse(response.text, inventory_pb2.Inventory())


def _sorted(inventory: inventory_pb2.Inventory) -> inventory_pb2.Inventory:
    return Elements.of(inventory).inventory()


async def test_every_kind_of_change_arrives_as_a_delta_that_rebuilds_the_config(api, cp) -> None:
    tenant_id, other_tenant = await api.new_tenant(), await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    first_api = await api.new_api(tenant_id, auth={"scopes": ["orders:read"], "forward_credential": True})
    await api.deploy(first_api, gateway_id)
    client = api

    async with delta_stream(cp, gateway_id, credential) as sse:
        assert (await sse.follow())[:2] == ("inventory", 2)

        async def check(change: str) -> int:
            event, generation, size = await sse.follow()
            assert event == "delta", change
            config = await _config(cp, gateway_id, credential)
            assert config.generation == generation, change
            assert sse.held is not None
            assert sse.held.inventory() == _sorted(config), change
            assert sse.held.hash() == inventory_hash(config), change
            return size

        second_api = await api.new_api(tenant_id, methods=["GET", "POST"], timeout_ms=1500)
        await api.deploy(second_api, gateway_id)
        await check("a route added (and the tenant's policies' applicable lists)")
        await client.create_policy(
            fresh_id("p"),
            "cors",
            {"allowedOrigins": ["https://a.example"]},
            tenant_id=tenant_id,
            scope="tenant",
        )
        await check("a tenant policy")
        await client.create_policy(
            fresh_id("p"),
            "rate_limit",
            {"maxRequests": 5, "intervalSeconds": 1},
            tenant_id=None,
            gateway_id=gateway_id,
        )
        await check("a gateway policy")
        api_policy = fresh_id("p")
        await client.create_policy(
            api_policy,
            "ip_filter",
            {"mode": "deny", "ip_list": ["10.0.0.0/8"]},
            tenant_id=tenant_id,
            targets=[first_api],
        )
        await check("an api policy")
        issuer = await client.add_issuer(tenant_id, "https://idp.example", jwks=_jwks("k1"))
        await check("an issuer")
        stored = await client.get_api(first_api, tenant_id=tenant_id)
        updated = {k: stored[k] for k in ("name", "upstream_url", "auth")} | {
            "methods": ["PUT"],
            "path_prefix": "/moved",
        }
        await client.update_api(first_api, updated, tenant_id=tenant_id)
        size = await check("a route changed")
        assert size < 2000  # the one route, not the inventory

        # Another tenant's first route brings its policies and issuer; its last route takes them away.
        await client.create_policy(
            fresh_id("p"), "cors", {"allowedOrigins": ["*"]}, tenant_id=other_tenant, scope="tenant"
        )
        await client.add_issuer(other_tenant, "https://other.example", jwks=_jwks("k2"))
        foreign_api = await api.new_api(other_tenant)
        await api.deploy(foreign_api, gateway_id)
        await check("a new tenant's route")
        held = sse.held.inventory()
        assert {p.tenant_id for p in held.policies} >= {tenant_id, other_tenant}
        assert {i.tenant_id for i in held.issuers} == {tenant_id, other_tenant}
        await client.undeploy(foreign_api, gateway_id)
        await check("that tenant's last route undeployed (a tombstone)")
        held = sse.held.inventory()
        assert other_tenant not in {i.tenant_id for i in held.issuers}
        assert [t.route_id for t in held.tombstones] == [foreign_api]
        await api.deploy(foreign_api, gateway_id)
        await check("redeployed (the tombstone leaves)")
        await client.delete_policy(api_policy, tenant_id=tenant_id)
        await check("a policy deleted")
        await client.delete_issuer(tenant_id, issuer["issuer_id"])
        await check("an issuer deleted")
        await client.delete_api(second_api, tenant_id=tenant_id)
        await check("an API deleted")

        # An MCP route brings its tenant's tools; a tool edit and its backing API's edit travel too.
        mcp_api = fresh_id("mcp")
        await client.create_mcp_api(mcp_api, tenant_id=tenant_id, path_prefix=f"/{fresh_id('m')}")
        await client.create_tool(
            "get_order",
            tenant_id=tenant_id,
            description="Get an order",
            input_schema={"type": "object", "properties": {"id": {"type": "string"}}, "required": ["id"]},
            api_id=first_api,
            method="PUT",
            path_template="/orders/{id}",
        )
        await check("a tool (not shipped: no MCP route here yet)")
        await api.deploy(mcp_api, gateway_id)
        await check("an MCP route and its tenant's tool")
        assert [t.name for t in sse.held.inventory().tools] == ["get_order"]
        await client.update_api(first_api, {**updated, "timeout_ms": 2500}, tenant_id=tenant_id)
        await check("the tool's backing API changed")
        await client.delete_tool("get_order", tenant_id=tenant_id)
        await check("a tool deleted")

        # Consumers, keys, plans and subscriptions travel too; a revocation is in the very next delta.
        keyed = await api.new_api(tenant_id, auth={"mode": "api_key"}, path_prefix=f"/{fresh_id('k')}")
        await api.deploy(keyed, gateway_id)
        await check("an api_key route")
        await client.create_consumer("acme", tenant_id=tenant_id, client_ids=["acme-app"])
        await check("a consumer")
        key = await client.create_key("acme", tenant_id=tenant_id)
        await check("a key")
        await client.create_plan("gold", tenant_id=tenant_id, requests=5, window_seconds=60)  # no generation
        await client.subscribe("s1", tenant_id=tenant_id, consumer_id="acme", api_id=keyed, plan_id="gold")
        await check("a subscription")
        await client.set_subscription_state("s1", "suspended", tenant_id=tenant_id)
        await check("a subscription suspended")
        await client.revoke_key("acme", key["key_id"], tenant_id=tenant_id)
        await check("a key revoked")
        held = sse.held.inventory()
        assert len(held.revoked_key_sha256) == 1
        assert [(c.consumer_id, list(c.key_sha256)) for c in held.consumers] == [("acme", [])]
        assert [(s.subscription_id, s.active) for s in held.subscriptions] == [("s1", False)]
        await client.delete_consumer("acme", tenant_id=tenant_id)
        await check("a consumer deleted (its subscription with it)")
        assert (sse.held.inventory().consumers, sse.held.inventory().subscriptions) == ([], [])


async def test_resume_sends_the_held_deltas_or_the_complete_inventory(api, cp, cp_factory) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    apis = [await api.new_api(tenant_id) for _ in range(3)]
    async with delta_stream(cp, gateway_id, credential) as sse:
        assert (await sse.follow())[:2] == ("inventory", 1)
        for api_id in apis:
            await api.deploy(api_id, gateway_id)
            assert (await sse.follow())[:2] == ("delta", (await api.generation(gateway_id)))
        held = sse.held
    assert held is not None
    assert held.generation == 4

    # Resumed at 2: the deltas 2→3 and 3→4 that this process holds.
    async with delta_stream(cp, gateway_id, credential, last_id="2") as sse:
        event, event_id, data = await sse.next()
        delta = json_format.Parse(data, inventory_pb2.InventoryDelta())
        assert (event, event_id, delta.base_generation) == ("delta", "3", 2)
        assert [r.route_id for r in delta.routes] == [apis[1]]
        assert (await sse.next())[1] == "4"

    # Several changes while nobody follows: one delta covers them (base 4 → 6).
    await api.undeploy(apis[0], gateway_id)
    await api.undeploy(apis[1], gateway_id)
    async with delta_stream(cp, gateway_id, credential, last_id="4") as sse:
        sse.held = held
        assert (await sse.follow())[:2] == ("delta", 6)
        assert sse.held.inventory() == _sorted(await _config(cp, gateway_id, credential))

    # Another CP process on the same database never saw generation 4: it sends everything.
    other = await cp_factory(cp.dsn)
    async with delta_stream(other, gateway_id, credential, last_id="4") as sse:
        assert (await sse.follow())[:2] == ("inventory", 6)


async def test_a_state_older_than_the_kept_removals_is_read_whole_and_still_gives_deltas(
    api, cp, monkeypatch
) -> None:
    """Past the retention of inventory_removals, the CP reads the gateway whole and compares: the
    deltas it sends are the same as when it reads only what changed."""
    from stoa_cp.store import changes

    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    kept, gone = await api.new_api(tenant_id), await api.new_api(tenant_id)
    await api.deploy(kept, gateway_id)
    await api.deploy(gone, gateway_id)
    async with delta_stream(cp, gateway_id, credential) as sse:
        assert (await sse.follow())[:2] == ("inventory", 3)
        monkeypatch.setattr(changes, "RETENTION_S", -1.0)
        await api.undeploy(gone, gateway_id)
        assert (await sse.follow())[:2] == ("delta", 4)
        await api.deploy(await api.new_api(tenant_id), gateway_id)
        assert (await sse.follow())[:2] == ("delta", 5)
        assert sse.held is not None
        assert sse.held.inventory() == _sorted(await _config(cp, gateway_id, credential))
