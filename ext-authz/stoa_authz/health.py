"""Readiness, in one place: the gRPC health service and the HTTP endpoints read the same state.

Ready = an audience is configured and at least one policy set is loaded. The HTTP side is three
GET endpoints on a bare asyncio server (a web framework would be more code than the endpoints).
"""

from __future__ import annotations

import asyncio
import json
import logging

from grpc_health.v1 import health, health_pb2

from stoa_authz.policy import PolicyStore

SERVICE_NAME = "envoy.service.auth.v3.Authorization"
_MAX_REQUEST_HEAD = 8192

log = logging.getLogger("stoa_authz.health")


class Readiness:
    def __init__(self, audience_configured: bool, store: PolicyStore) -> None:
        self._audience_configured = audience_configured
        self._store = store
        # The synchronous servicer: its state is set from the event loop and read by gRPC threads.
        self.grpc = health.HealthServicer()

    @property
    def ready(self) -> bool:
        return self._audience_configured and bool(self._store)

    def reason(self) -> str:
        if not self._audience_configured:
            return "not_configured"
        if not self._store:
            return "policy_unavailable"
        return "ready"

    def publish(self) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self.ready
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            self.grpc.set(name, status)


class HttpEndpoints:
    def __init__(self, readiness: Readiness, jwks: bytes) -> None:
        self._readiness = readiness
        self._jwks = jwks

    def answer(self, method: str, path: str) -> tuple[int, bytes]:
        if method not in ("GET", "HEAD"):
            return 405, b'{"error":"method_not_allowed"}'
        path = path.split("?", 1)[0]
        if path == "/health/live":
            return 200, b'{"status":"live"}'
        if path == "/health/ready":
            state = self._readiness.reason()
            return (200 if state == "ready" else 503), json.dumps({"status": state}).encode()
        if path == "/.well-known/jwks.json":
            return 200, self._jwks
        return 404, b'{"error":"not_found"}'

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=5)
            if len(head) > _MAX_REQUEST_HEAD:
                raise ValueError("request head too large")
            method, path, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            status, body = self.answer(method, path)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ValueError):
            status, body = 400, b'{"error":"bad_request"}'
            method = "GET"
        phrase = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}.get(
            status, "Service Unavailable"
        )
        writer.write(
            f"HTTP/1.1 {status} {phrase}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode()
            + (body if method != "HEAD" else b"")
        )
        try:
            await writer.drain()
        finally:
            writer.close()

    async def start(self, host: str, port: int, reuse_port: bool) -> asyncio.Server:
        return await asyncio.start_server(
            self.handle, host, port, reuse_port=reuse_port, limit=_MAX_REQUEST_HEAD
        )
