"""Readiness and metrics, in one place: the gRPC health service and the HTTP endpoints read the
same state. Ready = at least one policy set is loaded. The HTTP side is a few GET endpoints on a
bare asyncio server, like the authorization service's."""

from __future__ import annotations

import asyncio
import json

from grpc_health.v1 import health, health_pb2

from stoa_proc.log import DecisionLog
from stoa_proc.policy import PolicyStore

SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MAX_REQUEST_HEAD = 8192


class Readiness:
    def __init__(self, store: PolicyStore) -> None:
        self._store = store
        self.grpc = health.aio.HealthServicer()

    @property
    def ready(self) -> bool:
        return bool(self._store)

    async def publish(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            await self.grpc.set(name, status)


def metrics_text(store: PolicyStore, decisions: DecisionLog) -> bytes:
    lines = [
        "# HELP stoa_proc_exchanges_total Exchanges processed, by outcome.",
        "# TYPE stoa_proc_exchanges_total counter",
    ]
    for reason, count in sorted(decisions.counts.items()):
        lines.append(f'stoa_proc_exchanges_total{{reason="{reason}"}} {count}')
    lines += [
        "# HELP stoa_proc_exchange_milliseconds_total Time spent in exchanges, summed.",
        "# TYPE stoa_proc_exchange_milliseconds_total counter",
        f"stoa_proc_exchange_milliseconds_total {decisions.latency_sum_ms:.3f}",
        "# HELP stoa_proc_policy_sets Policy sets held (the newest and a few older ones).",
        "# TYPE stoa_proc_policy_sets gauge",
        f"stoa_proc_policy_sets {len(store.versions())}",
    ]
    return ("\n".join(lines) + "\n").encode()


class HttpEndpoints:
    def __init__(self, readiness: Readiness, store: PolicyStore, decisions: DecisionLog) -> None:
        self._readiness = readiness
        self._store = store
        self._decisions = decisions

    def answer(self, method: str, path: str) -> tuple[int, str, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, "application/json", b'{"error":"method_not_allowed"}'
        path = path.split("?", 1)[0]
        if path == "/health/live":
            return 200, "application/json", b'{"status":"live"}'
        if path == "/health/ready":
            ready = self._readiness.ready
            body = json.dumps({"status": "ready" if ready else "policy_unavailable"}).encode()
            return (200 if ready else 503), "application/json", body
        if path == "/metrics":
            return 200, METRICS_TYPE, metrics_text(self._store, self._decisions)
        return 404, "application/json", b'{"error":"not_found"}'

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            status, content_type, body = self.answer(method, path)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            status, content_type, body = 400, "application/json", b'{"error":"bad_request"}'
            method = "GET"
        phrase = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}.get(
            status, "Service Unavailable"
        )
        writer.write(
            f"HTTP/1.1 {status} {phrase}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + (body if method != "HEAD" else b"")
        )
        try:
            await writer.drain()
        finally:
            writer.close()

    async def start(self, host: str, port: int) -> asyncio.Server:
        return await asyncio.start_server(self.handle, host, port, limit=_MAX_REQUEST_HEAD)
