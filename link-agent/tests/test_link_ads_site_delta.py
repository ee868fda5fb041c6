"""The authorization service's real subscription over delta xDS against the Link's ADS server (real
gRPC, mutual TLS): a 1-route change moves only its bucket, a refused push leaves the service's set and
what the server knows it holds as they were, and a reconnect is sent only what it lacks."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.service.discovery.v3 import discovery_pb2
from google.rpc import status_pb2
from stoa_authz.ads import subscribe
from stoa_authz.policy import PolicySet, PolicyStore
from stoa_harness.wait import wait_until_async
from stoa_link import certs
from stoa_link.ads import AdsServer, TlsMaterial
from stoa_link.ads.stream import Streams
from stoa_ops.policy_sets import PolicySubscription, channel_credentials
from stoa_proto import authz_pb2
from stoa_translate.policy_set import route_bucket, set_version
from stoa_translate.snapshot import AUTHZ_POLICY_SET, Snapshot

ENVOY = "spiffe://stoa.local/envoy"
AUTHZ = "spiffe://stoa.local/ext-authz"
ROUTES = 2_000  # every one of the 64 buckets holds some


def policy_set(api_of: dict[str, str], broken: str = "") -> list[authz_pb2.AuthzPolicySet]:
    """`default` and the route buckets of auth-none routes (route id → API id); `broken`: a bucket
    carrying what only `default` may (the service refuses the set)."""
    buckets: dict[str, authz_pb2.AuthzPolicySet] = {}
    for route_id in sorted(api_of):
        name = route_bucket(route_id)
        bucket = buckets.setdefault(name, authz_pb2.AuthzPolicySet(name=name))
        bucket.routes.add(route_id=route_id, tenant_id="acme", api_id=api_of[route_id], auth_mode="none")
    if broken:
        buckets[broken].revoked_key_sha256.append("ab" * 32)
    for bucket in buckets.values():  # a content hash, as the translator's
        bucket.version = hashlib.sha256(bucket.SerializeToString(deterministic=True)).hexdigest()[:16]
    return [authz_pb2.AuthzPolicySet(name="default", version="site-1"), *buckets.values()]


def snapshot(generation: int, resources: list[authz_pb2.AuthzPolicySet]) -> Snapshot:
    return Snapshot.build("gw", generation, {AUTHZ_POLICY_SET: resources})


@pytest.fixture(scope="module")
def tls_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tls")
    certs.write_dev_certs(out, ENVOY, AUTHZ)
    return out


@pytest.fixture
async def server(tls_dir: Path) -> AsyncIterator[AdsServer]:
    ads = AdsServer(
        "127.0.0.1:0",
        TlsMaterial.server_from_dir(tls_dir),
        {AUTHZ: frozenset({AUTHZ_POLICY_SET})},
        ack_timeout_s=5.0,
    )
    await ads.start()
    yield ads
    await ads.stop(0)


@contextlib.asynccontextmanager
async def authz(
    tls_dir: Path, port: int, held: dict[str, dict[str, Any]] | None = None
) -> AsyncIterator[tuple[PolicySubscription, PolicyStore, list[discovery_pb2.DeltaDiscoveryResponse]]]:
    """stoa-authz's subscription (holding `held` already, as after an earlier stream), recording every
    delta response it receives."""
    store = PolicyStore()
    credentials = channel_credentials(
        (tls_dir / certs.CA_FILE).read_bytes(),
        (tls_dir / "authz-client.pem").read_bytes(),
        (tls_dir / "authz-client-key.pem").read_bytes(),
    )
    subscription = subscribe(f"localhost:{port}", store, credentials)
    if held:
        subscription.held.update(held)
    received: list[discovery_pb2.DeltaDiscoveryResponse] = []
    taken = subscription.apply_delta

    async def recorded(response: discovery_pb2.DeltaDiscoveryResponse) -> discovery_pb2.DeltaDiscoveryRequest:
        received.append(response)
        return await taken(response)

    subscription.apply_delta = recorded  # type: ignore[method-assign]
    task = asyncio.ensure_future(subscription.run())
    try:
        yield subscription, store, received
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def newest(store: PolicyStore) -> PolicySet:
    versions = store.versions()
    assert versions, "no set accepted"
    policy_set = store.get(versions[-1])
    assert policy_set is not None
    return policy_set


def held_versions(subscription: PolicySubscription) -> dict[str, str]:
    """The policy sets the service holds: name → the set's own version."""
    (held,) = subscription.held.values()
    return {name: authz_pb2.AuthzPolicySet.FromString(r.resource.value).version for name, r in held.items()}


async def test_a_one_route_change_sends_its_bucket_alone_and_a_refused_push_changes_nothing(
    tls_dir: Path, server: AdsServer
) -> None:
    apis = {f"route-{i:05d}": f"api-{i}" for i in range(ROUTES)}
    first = policy_set(apis)
    async with authz(tls_dir, server.port) as (subscription, store, received):
        await wait_until_async(lambda: server.connected(AUTHZ) > 0, 5, "stoa-authz to connect")
        assert (await server.publish(snapshot(1, first))).acked
        (everything,) = received
        assert (len(everything.resources), len(newest(store).routes)) == (65, ROUTES)

        # One route edited: its bucket alone is sent, and the service holds the complete set.
        apis["route-00007"] = "api-7-edited"
        second = policy_set(apis)
        assert (await server.publish(snapshot(2, second))).acked
        change = received[-1]
        assert ([r.name for r in change.resources], list(change.removed_resources)) == (
            [route_bucket("route-00007")],
            [],
        )
        assert change.ByteSize() * 30 < everything.ByteSize()
        assert newest(store).version == set_version(second)
        assert newest(store).routes["route-00007"].api_id == "api-7-edited"
        assert len(newest(store).routes) == ROUTES

        # Refused (one bucket breaks the set, another is emptied): NACKed, the publication fails,
        # and the service still holds and decides with the set it had.
        gone = route_bucket("route-00001")
        emptied = {r: a for r, a in apis.items() if route_bucket(r) != gone}
        refused = await server.publish(snapshot(3, policy_set(emptied, broken=route_bucket("route-00002"))))
        assert (refused.acked, refused.reason) == (False, "NACK")
        assert "only routes belong in a route bucket" in refused.detail
        await server.settled()  # the acknowledged snapshot is served again
        assert newest(store).version == set_version(second)
        assert held_versions(subscription) == {r.name: r.version for r in second}
        # The server knows the service still holds the emptied bucket: its removal is sent.
        assert (await server.publish(snapshot(4, policy_set(emptied)))).acked
        assert gone in received[-1].removed_resources
        assert "route-00001" not in newest(store).routes
        assert len(newest(store).routes) == len(emptied)
        held = {t: dict(r) for t, r in subscription.held.items()}

    # Reconnecting with what it holds, the service is sent nothing again, then only what changes.
    async with authz(tls_dir, server.port, held) as (subscription, store, received):
        await wait_until_async(lambda: server.connected(AUTHZ) > 0, 5, "stoa-authz to reconnect")
        apis = dict(emptied, **{"route-00009": "api-9-edited"})
        assert (await server.publish(snapshot(5, policy_set(apis)))).acked
        (caught_up,) = received
        assert [r.name for r in caught_up.resources] == [route_bucket("route-00009")]
        assert newest(store).routes["route-00009"].api_id == "api-9-edited"
        assert len(newest(store).routes) == len(apis)


class _Context:
    """The part of a gRPC servicer context a stream uses, in process."""

    def __init__(self) -> None:
        self.sent: asyncio.Queue[discovery_pb2.DeltaDiscoveryResponse] = asyncio.Queue()

    def peer(self) -> str:
        return "in-process"

    async def write(self, response: discovery_pb2.DeltaDiscoveryResponse) -> None:
        await self.sent.put(response)

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise AssertionError(f"{code}: {message}")


async def test_after_a_refused_push_the_names_it_removed_are_still_removed_later() -> None:
    streams = Streams({AUTHZ: frozenset({AUTHZ_POLICY_SET})})
    requests: asyncio.Queue[discovery_pb2.DeltaDiscoveryRequest | None] = asyncio.Queue()

    async def incoming() -> AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]:
        while (request := await requests.get()) is not None:
            yield request

    context = _Context()
    task = asyncio.ensure_future(streams.run(AUTHZ, incoming(), context, delta=True))  # type: ignore[arg-type]

    def serve(version: str, *names: str) -> None:
        streams.serve(
            AUTHZ_POLICY_SET, version, tuple(authz_pb2.AuthzPolicySet(name=n, version=version) for n in names)
        )

    async def answer(refuse: bool = False) -> discovery_pb2.DeltaDiscoveryResponse:
        response = await asyncio.wait_for(context.sent.get(), 5)
        error = status_pb2.Status(code=3, message="refused") if refuse else None
        requests.put_nowait(
            discovery_pb2.DeltaDiscoveryRequest(
                type_url=AUTHZ_POLICY_SET, response_nonce=response.nonce, error_detail=error
            )
        )
        return response

    try:
        requests.put_nowait(discovery_pb2.DeltaDiscoveryRequest(type_url=AUTHZ_POLICY_SET))
        await wait_until_async(lambda: streams.connected(AUTHZ) > 0, 5, "the stream")
        serve("v1", "default", "routes-001", "routes-002")
        await answer()
        serve("v2", "default", "routes-002")  # routes-001 removed, and refused
        assert list((await answer(refuse=True)).removed_resources) == ["routes-001"]
        await wait_until_async(lambda: streams.nacks[AUTHZ_POLICY_SET] == 1, 5, "the NACK")
        # Not a restore: another set still without routes-001. The client holds it yet: removed now,
        # and everything it holds is unsure, so sent again.
        serve("v3", "default", "routes-003")
        after = await answer()
        assert (sorted(r.name for r in after.resources), list(after.removed_resources)) == (
            ["default", "routes-003"],
            ["routes-001", "routes-002"],
        )
    finally:
        requests.put_nowait(None)
        await asyncio.wait_for(task, 5)
