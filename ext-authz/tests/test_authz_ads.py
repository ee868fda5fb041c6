"""The ADS client over state of the world against an in-process ADS server (plain gRPC): subscribe,
ACK, NACK with the previous set kept, version pinning while the next set rolls out, and resubscribe
after a restart (delta xDS: `ops/tests/test_ops_policy_sets.py` and the Link's ADS tests)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from collections.abc import AsyncIterator

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from google.protobuf import any_pb2
from joserfc.jwk import OKPKey, RSAKey
from stoa_authz.ads import TYPE_URL, subscribe
from stoa_authz.check import Decider, DecisionConfig
from stoa_authz.envelope import Envelope
from stoa_authz.identify import Identifier
from stoa_authz.log import DecisionLog
from stoa_authz.policy import PolicyStore
from stoa_translate.policy_set import route_version

AUD = "stoa-test"


class FakeAds(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self) -> None:
        self.requests: asyncio.Queue = asyncio.Queue()
        self.outgoing: asyncio.Queue = asyncio.Queue()

    async def StreamAggregatedResources(self, request_iterator, context):
        async def pump():
            async for request in request_iterator:
                await self.requests.put(request)

        reader = asyncio.ensure_future(pump())
        try:
            while True:
                yield await self.outgoing.get()
        finally:
            reader.cancel()


async def start_server(port: int = 0) -> tuple[grpc.aio.Server, FakeAds, int]:
    fake = FakeAds()
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(fake, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, fake, bound


def response(message, version_info: str, nonce: str) -> DiscoveryResponse:
    resource = any_pb2.Any()
    resource.Pack(message)
    return DiscoveryResponse(version_info=version_info, nonce=nonce, type_url=TYPE_URL, resources=[resource])


async def next_request(fake: FakeAds):
    return await asyncio.wait_for(fake.requests.get(), timeout=10)


@contextlib.asynccontextmanager
async def subscription(port: int) -> AsyncIterator[PolicyStore]:
    """A subscription to the server on `port`, running until the block ends."""
    store = PolicyStore()
    task = asyncio.ensure_future(subscribe(f"127.0.0.1:{port}", store, delta=False).run())
    try:
        yield store
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.fixture
async def ads():
    server, fake, port = await start_server()
    async with subscription(port) as store:
        yield fake, store
    await server.stop(grace=0)


async def test_ack_nack_and_pinning(ads, idp, policy, req):
    fake, store = ads
    subscribe = await next_request(fake)
    assert subscribe.type_url == TYPE_URL
    assert subscribe.node.id
    assert not subscribe.response_nonce

    await fake.outgoing.put(response(policy(idp, "v1"), "snap-1", "n1"))
    ack = await next_request(fake)
    assert (ack.version_info, ack.response_nonce, ack.HasField("error_detail")) == ("snap-1", "n1", False)
    assert store.versions() == ["v1"]

    bad = policy(idp, "v2")
    bad.issuers[0].jwks_json = json.dumps({"keys": [RSAKey.generate_key(2048).as_dict(private=True)]})
    await fake.outgoing.put(response(bad, "snap-2", "n2"))
    nack = await next_request(fake)
    assert (nack.version_info, nack.response_nonce) == ("snap-1", "n2")
    assert "private" in nack.error_detail.message
    assert store.versions() == ["v1"]

    # Set v3 changes the route's scope; routes still built with v1 are decided with v1.
    newer = policy(idp, "v3")
    del newer.routes[0].scopes[:]
    newer.routes[0].scopes.append("orders:write")
    await fake.outgoing.put(response(newer, "snap-3", "n3"))
    ack = await next_request(fake)
    assert (ack.version_info, ack.response_nonce) == ("snap-3", "n3")
    assert store.versions() == ["v1", "v3"]

    decider = Decider(
        DecisionConfig(AUD, frozenset()),
        store,
        Identifier(AUD, "tenant_id"),
        Envelope(OKPKey.generate_key("Ed25519"), "x"),
        DecisionLog(io.StringIO()),
    )
    token = idp.mint(tenant="acme", scope="orders:read")
    headers = {"authorization": f"Bearer {token}"}
    assert decider.decide(req(headers)).HasField("ok_response")
    assert (
        decider.decide(req(headers, version=route_version(newer.routes[0]))).denied_response.status.code
        == 403
    )
    # An entry of no accepted set (v2 was refused; this one was never sent): not decidable.
    assert decider.decide(req(headers, version="0123456789abcdef")).denied_response.status.code == 503


async def test_a_server_without_delta_xds_is_subscribed_to_over_state_of_the_world(idp, policy) -> None:
    server, fake, port = await start_server()  # state of the world only: delta is UNIMPLEMENTED
    store = PolicyStore()
    task = asyncio.ensure_future(subscribe(f"127.0.0.1:{port}", store).run())
    try:
        first = await next_request(fake)
        assert (first.type_url, first.response_nonce) == (TYPE_URL, "")
        await fake.outgoing.put(response(policy(idp, "v1"), "snap-1", "n1"))
        ack = await next_request(fake)
        assert (ack.response_nonce, ack.version_info, ack.HasField("error_detail")) == ("n1", "snap-1", False)
        assert store.versions()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await server.stop(grace=0)


async def test_empty_or_foreign_response_is_nacked(ads, idp, policy):
    fake, store = ads
    await next_request(fake)
    await fake.outgoing.put(DiscoveryResponse(version_info="snap-0", nonce="n0", type_url=TYPE_URL))
    nack = await next_request(fake)
    assert nack.error_detail.message
    assert not store


async def test_resubscribes_after_server_restart(idp, policy):
    server, fake, port = await start_server()
    try:
        async with subscription(port) as store:
            await next_request(fake)
            await fake.outgoing.put(response(policy(idp, "v1"), "snap-1", "n1"))
            await next_request(fake)
            await server.stop(grace=0)
            server, fake, _ = await start_server(port)
            again = await next_request(fake)
            assert again.version_info == "snap-1"
            assert store.versions() == ["v1"]  # kept while disconnected
    finally:
        await server.stop(grace=0)


async def test_unforeseen_compile_failure_is_a_nack(ads, idp, policy, monkeypatch):
    fake, store = ads
    await next_request(fake)
    await fake.outgoing.put(response(policy(idp, "v1"), "snap-1", "n1"))
    await next_request(fake)

    def broken(_message):
        raise TypeError("unhashable type: 'list'")

    monkeypatch.setattr("stoa_authz.ads.compile_policy_set", broken)
    await fake.outgoing.put(response(policy(idp, "v2"), "snap-2", "n2"))
    nack = await next_request(fake)
    assert (nack.version_info, nack.response_nonce) == ("snap-1", "n2")
    assert "TypeError" in nack.error_detail.message
    assert store.versions() == ["v1"]
