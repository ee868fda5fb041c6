"""The `stoa-authz` process: start-up checks, readiness (HTTP and gRPC health), Checks over gRPC
against a policy set from an in-process ADS server, the published identity key, and the decision log."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc
import httpx
import pytest
from envoy.service.auth.v3 import external_auth_pb2_grpc
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from google.protobuf import any_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from joserfc import jws
from joserfc.jwk import import_key
from stoa_authz.ads import TYPE_URL
from stoa_harness.one_set_ads import delta_of
from stoa_harness.ports import free_port
from stoa_harness.processes import stop_group
from stoa_harness.wait import wait_until_async

AUD = "stoa-test"


class PushAds(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """Sends the current response to every subscriber, now and on each publish; records requests."""

    def __init__(self) -> None:
        self.response: DiscoveryResponse | None = None
        self.requests: list = []
        self._streams: list[asyncio.Queue] = []

    def publish(self, response: DiscoveryResponse) -> None:
        self.response = response
        for queue in self._streams:
            queue.put_nowait(response)

    def acked_nodes(self) -> set[str]:
        return {r.node.id for r in self.requests if r.response_nonce and not r.HasField("error_detail")}

    async def DeltaAggregatedResources(self, request_iterator, context):
        # The service subscribes over delta xDS: each push carries the complete set.
        queue: asyncio.Queue = asyncio.Queue()
        self._streams.append(queue)

        async def record():
            async for request in request_iterator:
                self.requests.append(request)

        reader = asyncio.ensure_future(record())
        if self.response is not None:
            queue.put_nowait(self.response)
        try:
            while True:
                yield delta_of(await queue.get())
        finally:
            reader.cancel()
            self._streams.remove(queue)


class Service:
    def __init__(self, tmp: Path, ads_port: int, **env: str) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        self.log_path = tmp / f"authz-{self.grpc_port}.log"
        self.env = {
            **os.environ,
            "STOA_ENV": "development",
            "STOA_AUTHZ_GRPC_ADDRESS": f"127.0.0.1:{self.grpc_port}",
            "STOA_AUTHZ_HTTP_ADDRESS": f"127.0.0.1:{self.http_port}",
            "STOA_AUTHZ_ADS_ADDRESS": f"127.0.0.1:{ads_port}",
            "STOA_AUTHZ_AUDIENCE": AUD,
            **env,
        }
        self.process: subprocess.Popen | None = None

    def start(self) -> Service:
        with self.log_path.open("wb") as log:
            # Its own session: stopping the group also stops its workers, even if the parent hangs.
            self.process = subprocess.Popen(
                [sys.executable, "-m", "stoa_authz"], env=self.env, stderr=log, start_new_session=True
            )
        return self

    def stop(self) -> None:
        if self.process is not None:
            stop_group(self.process, timeout=15)

    def log_lines(self) -> list[dict]:
        return [json.loads(line) for line in self.log_path.read_text().splitlines() if line.startswith("{")]

    async def ready(self) -> httpx.Response:
        async with httpx.AsyncClient() as client:
            return await client.get(f"http://127.0.0.1:{self.http_port}/health/ready")

    async def health(self) -> int:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service="envoy.service.auth.v3.Authorization"), timeout=2
            )
            return reply.status

    async def check(self, request):
        async with grpc.aio.insecure_channel(f"127.0.0.1:{self.grpc_port}") as channel:
            return await external_auth_pb2_grpc.AuthorizationStub(channel).Check(request, timeout=5)


@pytest.fixture
async def ads_server():
    fake = PushAds()
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(fake, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    yield fake, port
    await server.stop(grace=0)


@pytest.fixture
def services(tmp_path):
    started: list[Service] = []

    def make(ads_port: int, **env: str) -> Service:
        service = Service(tmp_path, ads_port, **env).start()
        started.append(service)
        return service

    yield make
    for service in started:
        service.stop()


def pack(message, version_info: str) -> DiscoveryResponse:
    resource = any_pb2.Any()
    resource.Pack(message)
    return DiscoveryResponse(
        version_info=version_info, nonce=version_info, type_url=TYPE_URL, resources=[resource]
    )


async def test_not_ready_until_policy_set_then_allows(ads_server, services, idp, policy, req):
    fake, ads_port = ads_server
    service = services(ads_port, STOA_AUTHZ_WORKERS="2")
    serving, not_serving = health_pb2.HealthCheckResponse.SERVING, health_pb2.HealthCheckResponse.NOT_SERVING

    async def not_ready():
        return (await service.ready()).status_code == 503 and await service.health() == not_serving

    # Two workers each import the whole service: ~10 s on a loaded 2-core machine, over 30 s at a load
    # average of 10 (a deadline, not a sleep: it costs nothing when the start is quick).
    await wait_until_async(not_ready, 90, "service up and not ready")
    token = idp.mint(tenant="acme", scope="orders:read", sub="subject-zx81")
    headers = {"authorization": f"Bearer {token}", "x-stoa-tenant-id": "forged"}
    assert (await service.check(req(headers))).denied_response.status.code == 503

    fake.publish(pack(policy(idp, "v1"), "snap-1"))

    async def both_acked():
        return len(fake.acked_nodes()) == 2

    await wait_until_async(both_acked, 10, "both workers ACK the policy set")

    async def ready():
        return (await service.ready()).status_code == 200 and await service.health() == serving

    await wait_until_async(ready, 10, "ready after the policy set (every worker)")
    # Every worker has the set (the port is shared): a run of Checks all allow.
    for _ in range(8):
        response = await service.check(req(headers))
        assert response.HasField("ok_response"), response
    async with httpx.AsyncClient() as client:
        jwks = (await client.get(f"http://127.0.0.1:{service.http_port}/.well-known/jwks.json")).json()
    envelope = {h.header.key: h.header.value for h in response.ok_response.headers}["x-stoa-identity"]
    verified = jws.deserialize_compact(envelope, import_key(jwks["keys"][0]), algorithms=["EdDSA"])
    assert json.loads(verified.payload)["sub"] == "subject-zx81"
    assert (await service.check(req({}))).denied_response.status.code == 401

    service.stop()
    decisions = [e for e in service.log_lines() if e.get("event") == "ext_authz_decision"]
    assert [e["reason"] for e in decisions].count("allowed") == 8
    assert {
        "decision",
        "reason",
        "tenant",
        "api",
        "route",
        "request_id",
        "latency_ms",
        "policy_set_version",
    } <= set(decisions[-1])
    text = service.log_path.read_text()
    for secret in (token, token.split(".")[2], "subject-zx81", "orders:read"):
        assert secret not in text


async def test_no_audience_denies_and_is_never_ready(ads_server, services, idp, policy, req):
    fake, ads_port = ads_server
    fake.publish(pack(policy(idp, "v1"), "snap-1"))
    service = services(ads_port, STOA_AUTHZ_AUDIENCE="")

    async def acked():
        return bool(fake.acked_nodes())

    await wait_until_async(acked, 10, "policy set ACKed")
    assert (await service.ready()).status_code == 503
    assert await service.health() == health_pb2.HealthCheckResponse.NOT_SERVING
    token = idp.mint(tenant="acme", scope="orders:read")
    response = await service.check(req({"authorization": f"Bearer {token}"}))
    assert response.denied_response.status.code == 503
    service.stop()
    reasons = [e["reason"] for e in service.log_lines() if e.get("event") == "ext_authz_decision"]
    assert reasons == ["not_configured"]
    assert any("STOA_AUTHZ_AUDIENCE" in e["event"] for e in service.log_lines())


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"STOA_AUTHZ_AUDIENCE": ""}, "STOA_AUTHZ_AUDIENCE is not set"),
        ({"STOA_AUTHZ_REQUIRED_SCOPES": ""}, "STOA_AUTHZ_REQUIRED_SCOPES is empty"),
        ({"STOA_AUTHZ_REQUIRED_SCOPES": "read, ,write"}, "blank entry"),
    ],
    ids=["no-audience", "empty-scopes", "blank-scope"],
)
def test_production_refuses_bad_settings(tmp_path, env, message):
    base = {
        **os.environ,
        "STOA_ENV": "production",
        "STOA_AUTHZ_AUDIENCE": AUD,
        "STOA_AUTHZ_REQUIRED_SCOPES": "platform",
        "STOA_AUTHZ_GRPC_ADDRESS": f"127.0.0.1:{free_port()}",
        "STOA_AUTHZ_HTTP_ADDRESS": f"127.0.0.1:{free_port()}",
    }
    result = subprocess.run(["stoa-authz"], env={**base, **env}, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "refusing to start in production" in result.stderr
    assert message in result.stderr


def test_development_warns_on_empty_scopes_and_public_bind(tmp_path):
    # Bad signing key file: the process stops right after the settings checks, having logged its warnings.
    key = tmp_path / "key.pem"
    key.write_text("not a key")
    env = {
        **os.environ,
        "STOA_ENV": "development",
        "STOA_AUTHZ_AUDIENCE": AUD,
        "STOA_AUTHZ_REQUIRED_SCOPES": "",
        "STOA_AUTHZ_GRPC_ADDRESS": "0.0.0.0:1",
        "STOA_AUTHZ_SIGNING_KEY_FILE": str(key),
    }
    result = subprocess.run(["stoa-authz"], env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "REQUIRED_SCOPES is empty" in result.stderr
    assert "0.0.0.0:1 is not loopback" in result.stderr
    assert "not an unencrypted PEM private key" in result.stderr
