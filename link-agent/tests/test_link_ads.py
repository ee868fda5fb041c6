"""The ADS server over real gRPC and mutual TLS, with Python clients standing in for Envoy and ext-authz,
and the authorization service's real subscription over delta xDS."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.listener.v3 import listener_pb2
from envoy.config.route.v3 import route_pb2
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import json_format
from google.rpc import status_pb2
from stoa_authz.ads import subscribe
from stoa_authz.policy import PolicySet, PolicyStore
from stoa_harness.wait import wait_until_async
from stoa_harness.xds_client import XdsClient as Client
from stoa_link import certs
from stoa_link.ads import AdsServer, TlsMaterial, peer_identity
from stoa_link.ads.stream import Streams
from stoa_link.health import readiness, routing
from stoa_ops.policy_sets import PolicySubscription, assembled, channel_credentials
from stoa_proto import authz_pb2, inventory_pb2
from stoa_translate import TranslateOptions, Translator
from stoa_translate.policy_set import route_bucket, set_version
from stoa_translate.snapshot import (
    AUTHZ_POLICY_SET,
    CLUSTER,
    ENVOY_TYPES,
    LISTENER,
    ROUTE,
    SITE_SERVICE_TYPES,
    Snapshot,
)

ENVOY = "spiffe://stoa.local/envoy"
AUTHZ = "spiffe://stoa.local/ext-authz"


def snapshot(generation: int, clusters: list[str], with_policy_set: bool = True) -> Snapshot:
    # Listener and routes differ per generation: a type whose content is unchanged is not pushed.
    resources: dict = {
        CLUSTER: [cluster_pb2.Cluster(name=n) for n in clusters],
        LISTENER: [listener_pb2.Listener(name="stoa-listener", stat_prefix=f"g{generation}")],
        ROUTE: [
            route_pb2.RouteConfiguration(name="stoa-routes", request_headers_to_remove=[f"g{generation}"])
        ],
    }
    if with_policy_set:
        resources[AUTHZ_POLICY_SET] = [authz_pb2.AuthzPolicySet(name="default", version=f"g{generation}")]
    return Snapshot.build("gw", generation, resources)


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
        {ENVOY: ENVOY_TYPES, AUTHZ: SITE_SERVICE_TYPES},
        ack_timeout_s=1.0,
    )
    await ads.start()
    yield ads
    await ads.stop(0)


async def connected(tls_dir: Path, ads: AdsServer, cert: str, *types: str) -> Client:
    client = Client(tls_dir, ads.port, cert)
    client.subscribe(*types)
    identity = ENVOY if cert == "envoy-client" else AUTHZ
    await wait_until_async(lambda: ads.connected(identity) > 0, 5, "the client to connect")
    return client


async def settled_back_on(server: AdsServer, first: Snapshot, *types: str) -> None:
    """Once the server has settled, `first` is served on every one of `types` and is the acked snapshot."""
    await asyncio.wait_for(server.settled(), 5)
    for type_url in types:
        assert server.served_version(type_url) == first.version
    assert server.acked_snapshot is first


async def test_publish_waits_for_both_clients_then_serves_policy_set_before_envoy_types(
    tls_dir: Path, server: AdsServer
) -> None:
    snap = snapshot(1, ["a"])
    publication = asyncio.create_task(server.publish(snap))
    envoy = await connected(tls_dir, server, "envoy-client", CLUSTER, LISTENER, ROUTE)
    await asyncio.sleep(0.1)
    assert not publication.done(), "published before the authorization service was connected"
    authz = await connected(tls_dir, server, "authz-client", AUTHZ_POLICY_SET)
    result = await asyncio.wait_for(publication, 5)
    assert result.acked
    assert result.version == snap.version
    assert envoy.versions(CLUSTER) == [snap.version]
    assert authz.versions(AUTHZ_POLICY_SET) == [snap.version]
    sends = [(e.type_url, e.identity) for e in server.event_log() if e.kind == "send"]
    assert sends[0] == (AUTHZ_POLICY_SET, AUTHZ)
    ack_policy = next(e.seq for e in server.event_log() if e.kind == "ack" and e.type_url == AUTHZ_POLICY_SET)
    first_envoy_send = next(e.seq for e in server.event_log() if e.kind == "send" and e.identity == ENVOY)
    assert ack_policy < first_envoy_send
    await envoy.close()
    await authz.close()


async def test_nack_restores_previous_snapshot_on_every_type(tls_dir: Path, server: AdsServer) -> None:
    envoy = await connected(tls_dir, server, "envoy-client", CLUSTER, LISTENER, ROUTE)
    authz = await connected(tls_dir, server, "authz-client", AUTHZ_POLICY_SET)
    first = snapshot(1, ["a"])
    assert (await server.publish(first)).acked
    second = snapshot(2, ["a", "b"])
    envoy.nack[ROUTE] = second.version
    result = await server.publish(second)
    assert not result.acked
    assert result.reason == "NACK"
    assert result.failed_type == ROUTE
    assert result.detail == f"bad {second.version}"
    # The last acknowledged snapshot was put back on every type, on every stream.
    await settled_back_on(server, first, CLUSTER, LISTENER, ROUTE)
    await wait_until_async(
        lambda: envoy.versions(ROUTE)[-1] == first.version, 5, "the first version back on RDS"
    )
    assert authz.versions(AUTHZ_POLICY_SET)[-1] == first.version
    await envoy.close()
    await authz.close()


async def test_ready_only_once_every_required_client_acknowledged_a_snapshot(
    tls_dir: Path, server: AdsServer
) -> None:
    assert readiness(server)[0] == f"waiting for ADS clients: {ENVOY}, {AUTHZ}"
    envoy = await connected(tls_dir, server, "envoy-client", CLUSTER, LISTENER, ROUTE)
    assert readiness(server)[0] == f"waiting for ADS clients: {AUTHZ}"
    authz = await connected(tls_dir, server, "authz-client", AUTHZ_POLICY_SET)
    refused = snapshot(1, ["a"])
    envoy.nack[ROUTE] = refused.version

    assert not (await server.publish(refused)).acked

    reason, state = readiness(server)
    assert reason == "no snapshot acknowledged by every required client yet"
    assert state["clients"] == {ENVOY: 1, AUTHZ: 1}
    assert server.nacks == {ROUTE: 1}
    good = snapshot(2, ["a"])
    assert (await server.publish(good)).acked
    reason, state = readiness(server)
    assert reason is None
    assert (state["generation"], state["version"]) == (2, good.version)
    await envoy.close()
    await authz.close()


async def test_missing_ack_fails_with_ack_timeout(tls_dir: Path, server: AdsServer) -> None:
    envoy = await connected(tls_dir, server, "envoy-client", CLUSTER, LISTENER, ROUTE)
    authz = await connected(tls_dir, server, "authz-client", AUTHZ_POLICY_SET)
    assert (await server.publish(snapshot(1, ["a"]))).acked
    envoy.silent.add(LISTENER)
    result = await server.publish(snapshot(2, ["a"]))
    assert not result.acked
    assert result.reason == "ACK_TIMEOUT"
    assert result.failed_type == LISTENER
    assert "LDS" in result.detail
    await envoy.close()
    await authz.close()


async def test_unknown_identity_gets_nothing(tls_dir: Path, server: AdsServer) -> None:
    issued = certs.issue_client(certs.load_ca(tls_dir), "spiffe://stoa.local/someone-else")
    stranger = Client(tls_dir, server.port, issued=issued)
    stranger.subscribe(CLUSTER)
    await asyncio.wait_for(stranger.task, 5)
    assert stranger.error is not None
    assert stranger.error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert stranger.received == []
    await stranger.close()


async def test_client_certificate_from_another_ca_is_refused_in_the_handshake(
    tls_dir: Path, server: AdsServer
) -> None:
    foreign = certs.issue_client(certs.make_ca(), ENVOY)
    client = Client(tls_dir, server.port, issued=foreign)
    client.subscribe(CLUSTER)
    await asyncio.wait_for(client.task, 5)
    assert client.error is not None
    assert client.error.code() == grpc.StatusCode.UNAVAILABLE
    assert server.connected(ENVOY) == 0
    await client.close()


async def test_identity_may_read_only_its_own_types(tls_dir: Path, server: AdsServer) -> None:
    authz = Client(tls_dir, server.port, "authz-client")
    authz.subscribe(CLUSTER)
    await asyncio.wait_for(authz.task, 5)
    assert authz.error is not None
    assert authz.error.code() == grpc.StatusCode.PERMISSION_DENIED
    assert "may not read" in (authz.error.details() or "")
    await authz.close()


class DeltaClient:
    """A minimal incremental-xDS client (as Envoy with DELTA_GRPC): CDS and LDS for every resource,
    RDS by name; it ACKs what arrives (or NACKs a version of `nack`) and keeps what it holds."""

    def __init__(self, tls_dir: Path, port: int, initial: dict[str, dict[str, str]] | None = None) -> None:
        ca = (tls_dir / certs.CA_FILE).read_bytes()
        creds = grpc.ssl_channel_credentials(
            ca, (tls_dir / "envoy-client-key.pem").read_bytes(), (tls_dir / "envoy-client.pem").read_bytes()
        )
        self.channel = grpc.aio.secure_channel(f"localhost:{port}", creds)
        self.requests: asyncio.Queue[discovery_pb2.DeltaDiscoveryRequest | None] = asyncio.Queue()
        self.received: list[discovery_pb2.DeltaDiscoveryResponse] = []
        self.held: dict[str, dict[str, str]] = {t: dict((initial or {}).get(t, {})) for t in ENVOY_TYPES}
        self.nack: str = ""  # a system version to refuse
        self.call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel).DeltaAggregatedResources(
            self._requests()
        )
        for type_url in ENVOY_TYPES:
            request = discovery_pb2.DeltaDiscoveryRequest(
                type_url=type_url, initial_resource_versions=self.held[type_url]
            )
            if type_url == ROUTE:
                request.resource_names_subscribe.append("stoa-routes")
            self.requests.put_nowait(request)
        self.task = asyncio.create_task(self._loop())

    async def _requests(self) -> AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]:
        while (item := await self.requests.get()) is not None:
            yield item

    async def _loop(self) -> None:
        async for response in self.call:
            self.received.append(response)
            request = discovery_pb2.DeltaDiscoveryRequest(
                type_url=response.type_url, response_nonce=response.nonce
            )
            if response.system_version_info == self.nack:
                request.error_detail.CopyFrom(status_pb2.Status(code=3, message="refused"))
            else:
                held = self.held[response.type_url]
                for name in response.removed_resources:
                    held.pop(name, None)
                held.update((r.name, r.version) for r in response.resources)
            self.requests.put_nowait(request)

    def sent(self, type_url: str) -> list[tuple[list[str], list[str]]]:
        """Per response of the type: (names sent, names removed)."""
        return [
            (sorted(r.name for r in x.resources), sorted(x.removed_resources))
            for x in self.received
            if x.type_url == type_url
        ]

    async def close(self) -> None:
        self.requests.put_nowait(None)
        self.call.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.channel.close()


@pytest.fixture
async def envoy_only(tls_dir: Path) -> AsyncIterator[AdsServer]:
    ads = AdsServer(
        "127.0.0.1:0", TlsMaterial.server_from_dir(tls_dir), {ENVOY: ENVOY_TYPES}, ack_timeout_s=1.0
    )
    await ads.start()
    yield ads
    await ads.stop(0)


async def test_delta_xds_sends_only_what_changed_removes_what_left_and_rolls_back(
    tls_dir: Path, envoy_only: AdsServer
) -> None:
    client = DeltaClient(tls_dir, envoy_only.port)
    await wait_until_async(lambda: envoy_only.connected(ENVOY) > 0, 5, "the delta client to connect")
    first = await envoy_only.publish(snapshot(1, ["a", "b"], with_policy_set=False))
    assert first.acked, first
    assert client.sent(CLUSTER) == [(["a", "b"], [])]

    # Make-before-break: the new cluster first (a and b are held already), b removed after the routes.
    second = await envoy_only.publish(snapshot(2, ["a", "c"], with_policy_set=False))
    assert second.acked, second
    assert client.sent(CLUSTER)[1:] == [(["c"], []), ([], ["b"])]
    assert client.sent(ROUTE)[-1] == (["stoa-routes"], [])
    assert set(client.held[CLUSTER]) == {"a", "c"}

    # A refused push fails the publication and what was acknowledged is put back.
    bad = snapshot(3, ["a", "c"], with_policy_set=False)
    client.nack = bad.version
    refused = await envoy_only.publish(bad)
    assert (refused.acked, refused.reason) == (False, "NACK")
    assert envoy_only.acked_snapshot is not None
    assert envoy_only.acked_snapshot.version == snapshot(2, ["a", "c"], with_policy_set=False).version
    await client.close()

    # A client reconnecting with what it holds gets only what differs (nothing for the clusters).
    held = {t: dict(v) for t, v in client.held.items()}
    again = DeltaClient(tls_dir, envoy_only.port, initial=held)
    await wait_until_async(lambda: envoy_only.connected(ENVOY) > 0, 5, "the delta client to reconnect")
    fourth = await envoy_only.publish(snapshot(4, ["a", "c", "d"], with_policy_set=False))
    assert fourth.acked, fourth
    assert again.sent(CLUSTER) == [(["d"], [])]
    await again.close()


async def test_cluster_removal_waits_for_route_ack_and_late_client_gets_current(
    tls_dir: Path, server: AdsServer
) -> None:
    envoy = await connected(tls_dir, server, "envoy-client", CLUSTER, LISTENER, ROUTE)
    authz = await connected(tls_dir, server, "authz-client", AUTHZ_POLICY_SET)
    first, second = snapshot(1, ["a", "b"]), snapshot(2, ["b", "c"])
    assert (await server.publish(first)).acked
    mark = server.event_log()[-1].seq
    assert (await server.publish(second)).acked
    cds = [r for r in envoy.received if r.type_url == CLUSTER][-2:]
    assert [sorted(cluster_pb2.Cluster.FromString(a.value).name for a in r.resources) for r in cds] == [
        ["a", "b", "c"],
        ["b", "c"],
    ]
    assert cds[0].version_info == f"{second.version}+{first.version}"
    assert cds[1].version_info == second.version
    events = [e for e in server.event_log() if e.seq > mark]
    rds_ack = next(e.seq for e in events if e.kind == "ack" and e.type_url == ROUTE)
    removal = [e.seq for e in events if e.kind == "send" and e.type_url == CLUSTER][-1]
    assert rds_ack < removal
    late = await connected(tls_dir, server, "envoy-client", CLUSTER, LISTENER)
    await wait_until_async(
        lambda: late.versions(LISTENER) == [second.version], 5, "the late client to get the version"
    )
    assert late.versions(CLUSTER) == [second.version]
    for client in (envoy, authz, late):
        await client.close()


async def test_without_authz_identity_policy_set_is_not_waited_for(tls_dir: Path) -> None:
    ads = AdsServer(
        "127.0.0.1:0", TlsMaterial.server_from_dir(tls_dir), {ENVOY: ENVOY_TYPES}, ack_timeout_s=1.0
    )
    await ads.start()
    try:
        envoy = await connected(tls_dir, ads, "envoy-client", CLUSTER, LISTENER, ROUTE)
        result = await asyncio.wait_for(ads.publish(snapshot(1, ["a"])), 5)
        assert result.acked
        assert all(e.type_url != AUTHZ_POLICY_SET for e in ads.event_log() if e.kind == "send")
        await envoy.close()
    finally:
        await ads.stop(0)


def test_tls_files_missing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="stoa-link certs"):
        TlsMaterial.server_from_dir(tmp_path)


class _Context:
    """Just the part of a grpc ServicerContext `peer_identity` reads."""

    def __init__(self, auth: dict[str, list[bytes]]) -> None:
        self._auth = auth

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth


@pytest.mark.parametrize(
    ("auth", "identity", "why"),
    [
        ({"ssl_tls_version": [b"TLSv1.3"], "peer_uri": [ENVOY.encode()]}, ENVOY, ""),
        # grpcio cannot refuse TLS 1.2 in the handshake: the servicer must.
        ({"ssl_tls_version": [b"TLSv1.2"], "peer_uri": [ENVOY.encode()]}, None, "TLS 1.3 required"),
        ({"peer_uri": [ENVOY.encode()]}, None, "TLS 1.3 required"),
        (
            {"ssl_tls_version": [b"TLSv1.3"], "peer_uri": [ENVOY.encode(), AUTHZ.encode()]},
            None,
            "exactly one",
        ),
        (
            {"ssl_tls_version": [b"TLSv1.3"], "x509_subject_alternative_name": [b"localhost"]},
            None,
            "exactly one",
        ),
    ],
)
def test_identity_needs_tls_1_3_and_a_single_uri_san(auth, identity, why) -> None:
    found, reason = peer_identity(_Context(auth))  # type: ignore[arg-type]
    assert found == identity
    assert why in reason


async def test_a_missed_ack_fails_at_the_deadline_then_the_acked_snapshot_is_put_back(
    tls_dir: Path, server: AdsServer
) -> None:
    envoy = await connected(tls_dir, server, "envoy-client", CLUSTER, LISTENER, ROUTE)
    authz = await connected(tls_dir, server, "authz-client", AUTHZ_POLICY_SET)
    first = snapshot(1, ["a"])
    assert (await server.publish(first)).acked
    envoy.silent.update({LISTENER, ROUTE})

    started = time.monotonic()
    result = await server.publish(snapshot(2, ["a"]))
    took = time.monotonic() - started

    assert result.reason == "ACK_TIMEOUT"
    # Returned when the deadline passed; putting the first snapshot back (which this silent client
    # would not acknowledge either) does not delay it by a second deadline.
    assert server.ack_timeout_s <= took < 1.5 * server.ack_timeout_s
    envoy.silent.clear()
    await settled_back_on(server, first, CLUSTER, LISTENER, ROUTE, AUTHZ_POLICY_SET)
    await envoy.close()
    await authz.close()


async def test_a_client_not_connected_fails_the_publication_at_the_deadline_naming_it(
    tls_dir: Path, server: AdsServer
) -> None:
    envoy = await connected(tls_dir, server, "envoy-client", CLUSTER, LISTENER, ROUTE)

    result = await asyncio.wait_for(server.publish(snapshot(1, ["a"])), 5 * server.ack_timeout_s)

    assert result.reason == "ACK_TIMEOUT"
    assert result.missing == (AUTHZ,)
    assert f"{AUTHZ} (not connected)" in result.detail
    assert envoy.versions(CLUSTER) == [], "Envoy got nothing before the policy set was in force"
    authz = await connected(tls_dir, server, "authz-client", AUTHZ_POLICY_SET)
    assert (await asyncio.wait_for(server.publish(snapshot(2, ["a"])), 5)).acked
    await envoy.close()
    await authz.close()


def test_readiness_says_how_the_acknowledged_snapshot_routes() -> None:
    def translated(routes: list[dict[str, object]]) -> tuple[Snapshot, tuple[str, ...]]:
        translator = Translator(TranslateOptions(route_scopes=True))
        doc = {"gateway_id": "gw", "generation": "1", "routes": routes}
        return translator.translate(json_format.ParseDict(doc, inventory_pb2.Inventory())), translator.unkeyed

    def api(route_id: str, prefix: str) -> dict[str, object]:
        return {
            "route_id": route_id,
            "tenant_id": "t",
            "api_id": route_id,
            "path_prefix": prefix,
            "upstream_url": "http://127.0.0.1:1",
        }

    keyed, unkeyed = translated([api("a", "/apis/a"), api("b", "/apis/b")])
    assert routing(keyed, unkeyed) == {"routing": "scoped", "scopes": 2, "route_tables": 2}
    one, unkeyed = translated([api("a", "/apis/a"), api("root", "/root")])
    assert routing(one, unkeyed) == {"routing": "one table", "unkeyed_routes": ["root"]}


# ---- a site service over delta xDS: the authorization service's real subscription ------------


SITE_ROUTES = 2_000  # every one of the 64 buckets holds some


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


def authz_snapshot(generation: int, resources: list[authz_pb2.AuthzPolicySet]) -> Snapshot:
    return Snapshot.build("gw", generation, {AUTHZ_POLICY_SET: resources})


@pytest.fixture
async def authz_only(tls_dir: Path) -> AsyncIterator[AdsServer]:
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
    tls_dir: Path, authz_only: AdsServer
) -> None:
    server = authz_only
    apis = {f"route-{i:05d}": f"api-{i}" for i in range(SITE_ROUTES)}
    first = policy_set(apis)
    async with authz(tls_dir, server.port) as (subscription, store, received):
        await wait_until_async(lambda: server.connected(AUTHZ) > 0, 5, "stoa-authz to connect")
        assert (await server.publish(authz_snapshot(1, first))).acked
        (everything,) = received
        assert (len(everything.resources), len(newest(store).routes)) == (65, SITE_ROUTES)

        # One route edited: its bucket alone is sent, and the service holds the complete set.
        apis["route-00007"] = "api-7-edited"
        second = policy_set(apis)
        assert (await server.publish(authz_snapshot(2, second))).acked
        change = received[-1]
        assert ([r.name for r in change.resources], list(change.removed_resources)) == (
            [route_bucket("route-00007")],
            [],
        )
        assert change.ByteSize() * 30 < everything.ByteSize()
        assert newest(store).version == set_version(second)
        assert newest(store).routes["route-00007"].api_id == "api-7-edited"
        assert len(newest(store).routes) == SITE_ROUTES

        # Refused (one bucket breaks the set, another is emptied): NACKed, the publication fails,
        # and the service still holds and decides with the set it had.
        gone = route_bucket("route-00001")
        emptied = {r: a for r, a in apis.items() if route_bucket(r) != gone}
        refused = await server.publish(
            authz_snapshot(3, policy_set(emptied, broken=route_bucket("route-00002")))
        )
        assert (refused.acked, refused.reason) == (False, "NACK")
        assert "only routes belong in a route bucket" in refused.detail
        await server.settled()  # the acknowledged snapshot is served again
        assert newest(store).version == set_version(second)
        assert held_versions(subscription) == {r.name: r.version for r in second}
        # The server knows the service still holds the emptied bucket: its removal is sent.
        assert (await server.publish(authz_snapshot(4, policy_set(emptied)))).acked
        assert gone in received[-1].removed_resources
        assert "route-00001" not in newest(store).routes
        assert len(newest(store).routes) == len(emptied)
        held = {t: dict(r) for t, r in subscription.held.items()}

    # Reconnecting with what it holds, the service is sent nothing again, then only what changes.
    async with authz(tls_dir, server.port, held) as (subscription, store, received):
        await wait_until_async(lambda: server.connected(AUTHZ) > 0, 5, "stoa-authz to reconnect")
        apis = dict(emptied, **{"route-00009": "api-9-edited"})
        assert (await server.publish(authz_snapshot(5, policy_set(apis)))).acked
        (caught_up,) = received
        assert [r.name for r in caught_up.resources] == [route_bucket("route-00009")]
        assert newest(store).routes["route-00009"].api_id == "api-9-edited"
        assert len(newest(store).routes) == len(apis)


class _StreamContext:
    """The part of a gRPC servicer context a stream uses, in process."""

    def __init__(self) -> None:
        self.sent: asyncio.Queue[discovery_pb2.DeltaDiscoveryResponse] = asyncio.Queue()

    def peer(self) -> str:
        return "in-process"

    async def write(self, response: discovery_pb2.DeltaDiscoveryResponse) -> None:
        await self.sent.put(response)

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise AssertionError(f"{code}: {message}")


class _DeltaClient:
    """An in-process delta stream of stoa-authz's identity: what the server sends it, its answers."""

    def __init__(self, streams: Streams) -> None:
        self.streams = streams
        self._requests: asyncio.Queue[discovery_pb2.DeltaDiscoveryRequest | None] = asyncio.Queue()
        self._context = _StreamContext()
        self._task: asyncio.Future[None] | None = None

    async def __aenter__(self) -> _DeltaClient:
        async def incoming() -> AsyncIterator[discovery_pb2.DeltaDiscoveryRequest]:
            while (request := await self._requests.get()) is not None:
                yield request

        self._task = asyncio.ensure_future(
            self.streams.run(AUTHZ, incoming(), self._context, delta=True)  # type: ignore[arg-type]
        )
        self._requests.put_nowait(discovery_pb2.DeltaDiscoveryRequest(type_url=AUTHZ_POLICY_SET))
        await wait_until_async(lambda: self.streams.connected(AUTHZ) > 0, 5, "the stream")
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._requests.put_nowait(None)
        assert self._task is not None
        await asyncio.wait_for(self._task, 5)

    def serve(self, version: str, *names: str, content: str = "") -> str:
        """Serve resources `names`, each of content `content` (its version field); the digest."""
        resources = tuple(authz_pb2.AuthzPolicySet(name=n, version=content or version) for n in names)
        return self.streams.serve(AUTHZ_POLICY_SET, version, resources)

    async def sent(self) -> discovery_pb2.DeltaDiscoveryResponse:
        return await asyncio.wait_for(self._context.sent.get(), 5)

    def answer(self, response: discovery_pb2.DeltaDiscoveryResponse, refuse: bool = False) -> None:
        error = status_pb2.Status(code=3, message="refused") if refuse else None
        self._requests.put_nowait(
            discovery_pb2.DeltaDiscoveryRequest(
                type_url=AUTHZ_POLICY_SET, response_nonce=response.nonce, error_detail=error
            )
        )


async def test_after_a_refused_push_the_names_it_removed_are_still_removed_later() -> None:
    streams = Streams({AUTHZ: frozenset({AUTHZ_POLICY_SET})})
    async with _DeltaClient(streams) as client:
        client.serve("v1", "default", "routes-001", "routes-002")
        client.answer(await client.sent())
        client.serve("v2", "default", "routes-002")  # routes-001 removed, and refused
        refused = await client.sent()
        assert list(refused.removed_resources) == ["routes-001"]
        client.answer(refused, refuse=True)
        await wait_until_async(lambda: streams.nacks[AUTHZ_POLICY_SET] == 1, 5, "the NACK")
        # Not a restore: another set still without routes-001. The client holds it yet: removed now,
        # and everything it holds is unsure, so sent again.
        client.serve("v3", "default", "routes-003")
        after = await client.sent()
        assert (sorted(r.name for r in after.resources), list(after.removed_resources)) == (
            ["default", "routes-003"],
            ["routes-001", "routes-002"],
        )


async def test_a_refusal_of_an_older_push_sends_everything_again() -> None:
    """A push goes out before the client answered the one before it; the client refuses the older
    one and takes the newer, a change on top of what it refused. The server counts the refusal,
    sends everything again, and only the client's answer to that counts as holding the set."""
    streams = Streams({AUTHZ: frozenset({AUTHZ_POLICY_SET})})
    held: dict[str, Any] = {}
    async with _DeltaClient(streams) as client:

        def take(response: discovery_pb2.DeltaDiscoveryResponse) -> None:
            nonlocal held
            held, _ = assembled(held, response)
            client.answer(response)

        client.serve("v1", "default", "routes-001", "routes-002", content="c")
        take(await client.sent())
        assert held.keys() == {"default", "routes-001", "routes-002"}
        client.serve("v2", "default", "routes-002", content="c")  # routes-001 removed
        v2 = await client.sent()
        digest = client.serve("v3", "default", "routes-002", "routes-003", content="c")  # v2 unanswered
        v3 = await client.sent()
        assert [r.name for r in v3.resources] == ["routes-003"]  # a change on top of v2
        client.answer(v2, refuse=True)
        take(v3)
        again = await client.sent()
        assert streams.nacks[AUTHZ_POLICY_SET] == 1
        assert streams.progress({AUTHZ_POLICY_SET: digest}, [AUTHZ]).pending  # v3's ACK does not count
        assert sorted(r.name for r in again.resources) == ["default", "routes-002", "routes-003"]
        assert list(again.removed_resources) == ["routes-001"]
        take(again)
        await wait_until_async(
            lambda: not streams.progress({AUTHZ_POLICY_SET: digest}, [AUTHZ]).pending, 5, "the set held"
        )
        assert held.keys() == {"default", "routes-002", "routes-003"}
