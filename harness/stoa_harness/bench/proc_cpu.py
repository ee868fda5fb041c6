"""CPU time per guarded exchange of a real `stoa-proc` process, beside the no-op processor's, driven
over real gRPC from this process.

    uv run python -m stoa_harness.bench.proc_cpu [--exchanges 5000] [--concurrency 8] [--profile out]

This process serves the bench's guardrail route (`processing.GUARDRAILS`) over an insecure loopback
ADS stream, starts the service as a subprocess (its decision log to a file, as under a supervisor),
and sends the messages Envoy sends on that route for a 1 KiB JSON body (the buffered body alone, what
the service reads of the headers as its attributes; a stream each; `--with-headers`: a request-headers
message first, as on a route that needs them), with a fixed number of streams in flight; then the same to
`noop_proc` on the same kind of server. CPU per exchange is each process's utime + stime over the
exchanges. Not a test: it prints numbers. Unlike `make bench` (Envoy and wrk on the same two
cores), it isolates the processor's own cost, and `noop_proc`'s figure is the gRPC floor under it.
"""

# ruff: noqa: ASYNC220, ASYNC240 - a bench driver: blocking process control before and after timing

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from envoy.config.core.v3.base_pb2 import HeaderMap, HeaderValue
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpBody, HttpHeaders, ProcessingRequest
from google.protobuf import any_pb2, struct_pb2
from stoa_proc.ads import TYPE_URL
from stoa_proto import proc_pb2, processing
from stoa_proto.processing import ROUTE_METADATA, VERSION_METADATA
from stoa_translate.policies import accept

from stoa_harness.bench.processing import GUARDRAILS, kib_body
from stoa_harness.bench.rig import cpu_seconds
from stoa_harness.one_set_ads import OneSetAds
from stoa_harness.ports import free_port
from stoa_harness.processes import stop_group, tcp_accepting
from stoa_harness.wait import wait_until_async

ROUTE = "bench-guard"
VERSION = "bench-1"


class NotLetThrough(Exception):
    """An exchange answered otherwise than "continue" (an Exception: asyncio lets a SystemExit raised
    in a task escape the loop instead of reaching the awaiting code)."""


def policy_set() -> DiscoveryResponse:
    message = proc_pb2.ProcPolicySet(name="default", version=VERSION, gateway_id="gw-bench")
    rules = accept("guardrails", "bench-guard", GUARDRAILS)  # the translator's normal form
    message.routes.add(route_id=ROUTE, tenant_id="acme", api_id=ROUTE).guardrails.CopyFrom(rules)
    resource = any_pb2.Any()
    resource.Pack(message)
    return DiscoveryResponse(version_info="snap-1", nonce="1", type_url=TYPE_URL, resources=[resource])


def exchange_messages(with_headers: bool) -> tuple[ProcessingRequest, ...]:
    """What Envoy sends on the guardrail route for the bench's 1 KiB body: the body with the stream's
    attributes; `with_headers`: after a request-headers message (typical header set)."""
    body = kib_body()
    headers = {
        ":authority": "127.0.0.1",
        ":path": f"/apis/{ROUTE}/resource",
        ":method": "POST",
        ":scheme": "http",
        "content-type": "application/json",
        "content-length": str(len(body)),
        "user-agent": "wrk",
        "x-forwarded-proto": "http",
        "x-request-id": "0b9a7c7e-1111-2222-3333-444455556666",
    }
    attributes = struct_pb2.Struct()
    attributes.update(
        {processing.REQUEST_ID: headers["x-request-id"], processing.CONTENT_TYPE: headers["content-type"]}
    )
    body_message = ProcessingRequest(request_body=HttpBody(body=body, end_of_stream=True))
    if not with_headers:
        body_message.attributes[processing.ATTRIBUTES_KEY].CopyFrom(attributes)
        return (body_message,)
    values = [HeaderValue(key=k, raw_value=v.encode()) for k, v in headers.items()]
    first = ProcessingRequest(request_headers=HttpHeaders(headers=HeaderMap(headers=values)))
    first.attributes[processing.ATTRIBUTES_KEY].CopyFrom(attributes)
    return (first, body_message)


async def drive(address: str, exchanges: int, concurrency: int, with_headers: bool = False) -> None:
    """`exchanges` exchanges, `concurrency` streams in flight; each must be let through."""
    messages = exchange_messages(with_headers)
    metadata = ((ROUTE_METADATA, ROUTE), (VERSION_METADATA, VERSION))
    async with grpc.aio.insecure_channel(address) as channel:
        stub = external_processor_pb2_grpc.ExternalProcessorStub(channel)

        async def worker(count: int) -> None:
            for _ in range(count):
                call = stub.Process(metadata=metadata, timeout=10)
                for message in messages:
                    await call.write(message)
                    answer = await call.read()
                    if not answer.HasField(message.WhichOneof("request")):  # type: ignore[arg-type]
                        raise NotLetThrough(f"the guarded exchange was not let through: {answer}")
                await call.done_writing()
                await call.read()  # the end of the stream

        await asyncio.gather(*(worker(exchanges // concurrency) for _ in range(concurrency)))


async def measure(
    name: str, command: list[str], env: dict[str, str], address: str, args: argparse.Namespace
) -> None:
    log = tempfile.NamedTemporaryFile(prefix=f"{name}-bench-", suffix=".log", delete=False)  # noqa: SIM115
    process = subprocess.Popen(command, env=env, stderr=log, start_new_session=True)
    try:
        host, port = address.rsplit(":", 1)
        await wait_until_async(lambda: tcp_accepting(host, int(port)), 30, f"{name} accepting")
        await wait_until_async(_served(address), 30, f"{name} serving the guardrail route")
        await drive(address, 500, args.concurrency)  # warm-up
        profiler = None
        if args.profile:
            output = f"{args.profile}.{name}.txt"
            spy = ["py-spy", "record", "--pid", str(process.pid), "--output", output, "--rate", "500"]
            profiler = subprocess.Popen(
                [*spy, "--nonblocking", "--format", "raw"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            await asyncio.sleep(1.0)  # let py-spy attach before the measured run
        done = (args.exchanges // args.concurrency) * args.concurrency
        cpu_before, wall_before = cpu_seconds([process.pid]).seconds, time.perf_counter()
        await drive(address, args.exchanges, args.concurrency, args.with_headers)
        wall = time.perf_counter() - wall_before
        cpu = cpu_seconds([process.pid]).seconds - cpu_before
        if profiler is not None:
            profiler.send_signal(2)
            profiler.wait(timeout=60)
        print(f"{name:10s} cpu/exchange={cpu / done * 1e6:7.1f} us  rate={done / wall:7.0f}/s")
    except BaseException:
        print(f"{name}: its log is kept: {log.name}", file=sys.stderr)
        raise
    else:
        Path(log.name).unlink(missing_ok=True)
    finally:
        stop_group(process, timeout=15)


def _served(address: str):  # noqa: ANN202 - an async predicate for wait_until_async
    async def served() -> bool:
        try:
            await asyncio.wait_for(drive(address, 1, 1), 2)
        except (grpc.aio.AioRpcError, NotLetThrough, TimeoutError):
            return False
        return True

    return served


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--exchanges", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--processors", default="stoa-proc,noop-proc")
    parser.add_argument(
        "--with-headers", action="store_true", help="send a request-headers message before the body"
    )
    parser.add_argument("--profile", help="py-spy collapsed stacks of each processor: <this>.<name>.txt")
    args = parser.parse_args()

    ads = OneSetAds(policy_set())
    server = grpc.aio.server()
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(ads, server)
    ads_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        print(f"exchanges={args.exchanges} concurrency={args.concurrency}")
        for name in args.processors.split(","):
            address = f"127.0.0.1:{free_port()}"
            env = {
                **os.environ,
                "STOA_ENV": "development",
                "STOA_PROC_GRPC_ADDRESS": address,
                "STOA_PROC_HTTP_ADDRESS": f"127.0.0.1:{free_port()}",
                "STOA_PROC_ADS_ADDRESS": f"127.0.0.1:{ads_port}",
            }
            if name == "stoa-proc":
                command = [sys.executable, "-m", "stoa_proc"]
            else:
                command = [sys.executable, "-m", "stoa_harness.bench.noop_proc", address]
            await measure(name, command, env, address, args)
    finally:
        await server.stop(grace=0)


if __name__ == "__main__":
    asyncio.run(main())
