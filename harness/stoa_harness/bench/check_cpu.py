"""CPU time per decision of a real `stoa-authz` process, driven over real gRPC from this process.

    uv run python -m stoa_harness.bench.check_cpu [--checks 5000] [--concurrency 8] [--workers 1]

This process serves the policy set over an (insecure, loopback) ADS stream, starts the service as a
subprocess, sends Checks with a fixed number in flight, and divides the service's process CPU time
(utime + stime of every process in its session, workers included) by the number of Checks.
Scenarios: `cached` (one valid token, the full JWT decision from the cache), `uncached` (a distinct
valid token per Check: signature verification every time), `deny` (no token).
Not a test: it prints numbers (a bench report, not a pass/fail). Unlike `make bench` (the estate,
Envoy and wrk), it isolates the service's own cost per Check; the /proc and port helpers are the
bench suite's.
"""

# ruff: noqa: ASYNC220, ASYNC240 - a bench driver: blocking process control before and after timing

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
import httpx
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from google.protobuf import any_pb2
from stoa_authz.ads import TYPE_URL
from stoa_proto import authz_pb2, inventory_pb2
from stoa_translate.policy_set import route_version

from stoa_harness.bench.rig import cpu_seconds, session_pids
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.one_set_ads import OneSetAds
from stoa_harness.ports import free_port
from stoa_harness.processes import stop_group
from stoa_harness.wait import GiveUp, WaitTimeout, wait_until_async

AUDIENCE = "stoa-bench"


ORDERS = authz_pb2.AuthzRoute(
    route_id="orders", tenant_id="acme", api_id="orders", auth_mode="jwt", scopes=["orders:read"]
)
ORDERS_VERSION = route_version(ORDERS)


def policy_set(idp: DevIdentityProvider) -> DiscoveryResponse:
    message = authz_pb2.AuthzPolicySet(
        name="default",
        version="bench-1",
        gateway_id="gw-bench",
        routes=[ORDERS],
        issuers=[
            inventory_pb2.TrustedIssuer(tenant_id="acme", issuer=idp.issuer, jwks_json=json.dumps(idp.jwks()))
        ],
    )
    resource = any_pb2.Any()
    resource.Pack(message)
    return DiscoveryResponse(version_info="snap-1", nonce="1", type_url=TYPE_URL, resources=[resource])


def check_request(token: str | None, n: int) -> external_auth_pb2.CheckRequest:
    """What Envoy sends for GET /apis/orders/items (typical header set)."""
    request = external_auth_pb2.CheckRequest()
    attributes = request.attributes
    attributes.context_extensions.update(
        {"tenant_id": "acme", "api_id": "orders", "route_id": "orders", "route_version": ORDERS_VERSION}
    )
    attributes.source.address.socket_address.address = "127.0.0.1"
    attributes.destination.address.socket_address.address = "127.0.0.1"
    http = attributes.request.http
    http.id = f"{n:016x}-bench"
    http.method, http.path, http.host, http.scheme, http.protocol = (
        "GET",
        "/apis/orders/items",
        "gw.local",
        "http",
        "HTTP/1.1",
    )
    headers = {
        ":authority": "gw.local",
        ":path": "/apis/orders/items",
        ":method": "GET",
        ":scheme": "http",
        "user-agent": "wrk",
        "accept": "*/*",
        "x-forwarded-proto": "http",
        "x-request-id": http.id,
    }
    if token is not None:
        headers["authorization"] = f"Bearer {token}"
    http.headers.update(headers)
    return request


async def drive(
    address: str, requests: list[external_auth_pb2.CheckRequest], concurrency: int
) -> tuple[int, int]:
    """Send every request with `concurrency` in flight; (allowed, denied)."""
    allowed = denied = 0
    queue = iter(requests)
    async with grpc.aio.insecure_channel(address) as channel:
        stub = external_auth_pb2_grpc.AuthorizationStub(channel)

        async def worker() -> None:
            nonlocal allowed, denied
            for request in queue:
                response = await stub.Check(request, timeout=10)
                if response.HasField("ok_response"):
                    allowed += 1
                else:
                    denied += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return allowed, denied


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--checks", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--scenarios", default="cached,uncached,deny")
    parser.add_argument(
        "--profile", help="py-spy profile of the cached scenario: a flame graph (.svg) or collapsed stacks"
    )
    args = parser.parse_args()

    idp = DevIdentityProvider(alg="RS256", audience=AUDIENCE)  # not started: mints and publishes keys
    ads = OneSetAds(policy_set(idp))
    server = grpc.aio.server()
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(ads, server)
    ads_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()

    grpc_address, http_port = f"127.0.0.1:{free_port()}", free_port()
    env = {
        **os.environ,
        "STOA_ENV": "development",
        "STOA_AUTHZ_GRPC_ADDRESS": grpc_address,
        "STOA_AUTHZ_HTTP_ADDRESS": f"127.0.0.1:{http_port}",
        "STOA_AUTHZ_ADS_ADDRESS": f"127.0.0.1:{ads_port}",
        "STOA_AUTHZ_AUDIENCE": AUDIENCE,
        "STOA_AUTHZ_WORKERS": str(args.workers),
    }
    log = tempfile.NamedTemporaryFile(prefix="stoa-authz-bench-", suffix=".log", delete=False)  # noqa: SIM115
    # Its own session: its CPU is summed over the session, and stopping the group stops the workers.
    service = subprocess.Popen(
        [sys.executable, "-m", "stoa_authz"], env=env, stderr=log, start_new_session=True
    )
    try:
        async with httpx.AsyncClient() as client:

            async def ready() -> bool:
                if service.poll() is not None:
                    raise GiveUp(f"stoa-authz exited; log: {log.name}")
                answer = await client.get(f"http://127.0.0.1:{http_port}/health/ready")
                return answer.status_code == 200 and ads.acks >= args.workers

            try:
                await wait_until_async(ready, 30, "stoa-authz ready with every worker's ACK")
            except (GiveUp, WaitTimeout) as exc:
                raise SystemExit(f"stoa-authz did not become ready ({exc}); log: {log.name}") from None

        token = idp.mint(tenant="acme", scope="orders:read", sub="bench-client")
        scenarios = {
            "cached": lambda n: check_request(token, n),
            "uncached": None,
            "deny": lambda n: check_request(None, n),
        }
        print(f"workers={args.workers} concurrency={args.concurrency} checks={args.checks}")
        for name in args.scenarios.split(","):
            if name == "uncached":
                tokens = [
                    idp.mint(tenant="acme", scope="orders:read", sub=f"c{n}") for n in range(args.checks)
                ]
                requests = [check_request(t, n) for n, t in enumerate(tokens)]
            else:
                requests = [scenarios[name](n) for n in range(args.checks)]  # type: ignore[misc]
            await drive(grpc_address, requests[: min(500, len(requests))], args.concurrency)  # warm-up
            profiler = None
            if args.profile and name == "cached":
                profiler = subprocess.Popen(
                    [
                        "py-spy",
                        "record",
                        "--pid",
                        str(service.pid),
                        "--output",
                        args.profile,
                        "--rate",
                        "500",
                        "--nonblocking",
                        "--format",
                        "flamegraph" if args.profile.endswith(".svg") else "raw",
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                await asyncio.sleep(1.0)  # let py-spy attach before the measured run
            pids = session_pids(service.pid)
            cpu_before, wall_before = cpu_seconds(pids).seconds, time.perf_counter()
            allowed, denied = await drive(grpc_address, requests, args.concurrency)
            wall = time.perf_counter() - wall_before
            cpu = cpu_seconds(pids).seconds - cpu_before
            if profiler is not None:
                profiler.send_signal(2)
                profiler.wait(timeout=60)
            total = allowed + denied
            print(
                f"{name:9s} allowed={allowed:6d} denied={denied:6d} "
                f"cpu/decision={cpu / total * 1e6:7.1f} us  rate={total / wall:8.0f}/s"
            )
    finally:
        stop_group(service, timeout=15)
        await server.stop(grace=0)
        Path(log.name).unlink(missing_ok=True)


if __name__ == "__main__":
    asyncio.run(main())
