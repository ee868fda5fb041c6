"""A site service's subscription over delta xDS, against an in-process ADS server (plain gRPC): the
complete set assembled from the resources held and those sent, a refused response leaving what is held
as it was, and a reconnect naming what is held. The choice of the site's resource."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping

import grpc
import pytest
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DeltaDiscoveryRequest, DeltaDiscoveryResponse, Resource
from google.protobuf import any_pb2
from stoa_ops.policy_sets import PolicySubscription, Refused, ResourceSet, assembled, the_site
from stoa_proto import authz_pb2

TYPE_URL = "type.googleapis.com/stoa.authz.v1.AuthzPolicySet"


def resource(name: str, version: str) -> Resource:
    packed = any_pb2.Any()
    packed.Pack(authz_pb2.AuthzPolicySet(name=name, version=version))
    return Resource(name=name, version=version, resource=packed)


def delta(nonce: str, *resources: Resource, removed: tuple[str, ...] = ()) -> DeltaDiscoveryResponse:
    return DeltaDiscoveryResponse(
        type_url=TYPE_URL,
        system_version_info=f"snap-{nonce}",
        nonce=nonce,
        resources=resources,
        removed_resources=removed,
    )


def contents(offered: ResourceSet) -> dict[str, str]:
    """Each resource of a complete set as name → version, in the set's order."""
    out: dict[str, str] = {}
    for packed in offered.resources:
        message = authz_pb2.AuthzPolicySet()
        assert packed.Unpack(message), packed.type_url
        out[message.name] = message.version
    return out


def test_the_complete_set_is_assembled_from_what_is_held_and_what_was_sent() -> None:
    held, first = assembled({}, delta("1", resource("routes-001", "a"), resource("default", "d")))
    assert list(contents(first).items()) == [("default", "d"), ("routes-001", "a")]  # name order
    assert (first.type_url, first.version_info) == (TYPE_URL, "snap-1")
    # A bucket changed: the others are kept as held.
    held, changed = assembled(
        {**held, "routes-002": resource("routes-002", "b")}, delta("2", resource("routes-001", "a2"))
    )
    assert contents(changed) == {"default": "d", "routes-001": "a2", "routes-002": "b"}
    # A bucket removed; what was held before is not touched (a refused set changes nothing).
    before = dict(held)
    after, removed = assembled(held, delta("3", removed=("routes-002", "routes-unknown")))
    assert contents(removed) == {"default": "d", "routes-001": "a2"}
    assert held == before
    assert set(after) == {"default", "routes-001"}
    # A resource sent without content is in the set as nothing a handler can decode.
    _, empty = assembled(after, delta("4", Resource(name="routes-003", version="x")))
    assert [r.type_url for r in empty.resources] == [TYPE_URL, TYPE_URL, ""]


def test_the_site_is_the_one_resource_named_default() -> None:
    default, bucket = authz_pb2.AuthzPolicySet(name="default"), authz_pb2.AuthzPolicySet(name="routes-001")
    assert the_site([bucket, default]) is default
    for wrong in ([bucket], [authz_pb2.AuthzPolicySet()], [default, default], []):
        with pytest.raises(Refused, match="expected one policy set named 'default'"):
            the_site(wrong)


class FakeDeltaAds(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """Sends what the test puts in `outgoing` (None ends the stream) and records every request."""

    def __init__(self) -> None:
        self.requests: asyncio.Queue[DeltaDiscoveryRequest] = asyncio.Queue()
        self.outgoing: asyncio.Queue[DeltaDiscoveryResponse | None] = asyncio.Queue()

    async def DeltaAggregatedResources(self, request_iterator, context):
        async def pump() -> None:
            async for request in request_iterator:
                await self.requests.put(request)

        reader = asyncio.ensure_future(pump())
        try:
            while (response := await self.outgoing.get()) is not None:
                yield response
        finally:
            reader.cancel()

    async def next_request(self) -> DeltaDiscoveryRequest:
        return await asyncio.wait_for(self.requests.get(), timeout=10)


@pytest.fixture
async def delta_ads() -> AsyncIterator[tuple[FakeDeltaAds, PolicySubscription, list[dict[str, str]]]]:
    fake = FakeDeltaAds()
    server = grpc.aio.server()
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    taken: list[dict[str, str]] = []

    async def handler(offered: ResourceSet) -> Mapping[str, object]:
        held = contents(offered)
        if "bad" in held.values():
            raise Refused("a bad bucket")
        taken.append(held)
        return {"resources": len(held)}

    subscription = PolicySubscription(f"127.0.0.1:{port}", service="stoa-test", resources={TYPE_URL: handler})
    task = asyncio.ensure_future(subscription.run())
    yield fake, subscription, taken
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    await server.stop(grace=0)


async def test_delta_responses_are_taken_on_what_is_held_and_a_refused_one_changes_nothing(
    delta_ads: tuple[FakeDeltaAds, PolicySubscription, list[dict[str, str]]],
) -> None:
    fake, subscription, taken = delta_ads
    subscribe = await fake.next_request()
    assert (subscribe.type_url, subscribe.node.id.startswith("stoa-test/")) == (TYPE_URL, True)
    assert not subscribe.resource_names_subscribe
    assert not subscribe.initial_resource_versions

    await fake.outgoing.put(
        delta("1", resource("default", "d1"), resource("routes-001", "a"), resource("routes-002", "b"))
    )
    ack = await fake.next_request()
    assert (ack.response_nonce, ack.HasField("error_detail")) == ("1", False)
    # One bucket changed: the handler still reads the whole set.
    await fake.outgoing.put(delta("2", resource("routes-001", "a2")))
    assert (await fake.next_request()).response_nonce == "2"
    assert taken[-1] == {"default": "d1", "routes-001": "a2", "routes-002": "b"}

    # Refused: a NACK naming the reason; what is held and in force stay as they were.
    await fake.outgoing.put(delta("3", resource("routes-002", "bad"), removed=("routes-001",)))
    nack = await fake.next_request()
    assert (nack.response_nonce, nack.error_detail.message) == ("3", "a bad bucket")
    assert {n: r.version for n, r in subscription.held[TYPE_URL].items()} == {
        "default": "d1",
        "routes-001": "a2",
        "routes-002": "b",
    }
    assert subscription.accepted_version_info == "snap-2"
    # The next response is taken on what was held before the refused one.
    await fake.outgoing.put(delta("4", removed=("routes-002",)))
    assert (await fake.next_request()).HasField("error_detail") is False
    assert taken[-1] == {"default": "d1", "routes-001": "a2"}

    # A new stream names what is held, so the server sends only what differs.
    await fake.outgoing.put(None)
    again = await fake.next_request()
    assert (again.response_nonce, dict(again.initial_resource_versions)) == (
        "",
        {"default": "d1", "routes-001": "a2"},
    )
    await fake.outgoing.put(delta("5", resource("routes-003", "c")))
    assert (await fake.next_request()).response_nonce == "5"
    assert taken[-1] == {"default": "d1", "routes-001": "a2", "routes-003": "c"}
