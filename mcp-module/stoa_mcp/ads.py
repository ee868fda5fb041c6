"""The ADS client: one state-of-the-world stream to the Link subscribing to the tool registry
(McpPolicySet) and to the signed tool permissions (ToolPermissions), ACKing or NACKing each like
Envoy. A refused registry or artifact is NACKed with the reason and what is in force stays.
Reconnects with jittered exponential backoff."""

from __future__ import annotations

import asyncio
import logging
import os
import random
import socket
from collections.abc import Callable

import grpc
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from google.protobuf.message import Message
from google.rpc import code_pb2, status_pb2
from stoa_proto import mcp_pb2

from stoa_mcp.permissions import Permissions, Refused
from stoa_mcp.registry import Registry, RegistryError, compile_policy_set

POLICY_SET_TYPE = "type.googleapis.com/stoa.mcp.v1.McpPolicySet"
PERMISSIONS_TYPE = "type.googleapis.com/stoa.mcp.v1.ToolPermissions"
RESOURCE_NAME = "default"
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 10.0

log = logging.getLogger("stoa_mcp.ads")


def channel_credentials(ca: bytes, cert: bytes, key: bytes) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def _one(response: DiscoveryResponse, message: type[Message]) -> Message:
    found = []
    for resource in response.resources:
        item = message()
        if resource.type_url != response.type_url or not resource.Unpack(item):
            raise RegistryError(f"resource of type {resource.type_url!r} is not a {message.DESCRIPTOR.name}")
        found.append(item)
    named = [item for item in found if item.name == RESOURCE_NAME] or found  # type: ignore[attr-defined]
    if len(named) != 1:
        raise RegistryError(f"expected one resource named {RESOURCE_NAME!r}, got {len(found)}")
    return named[0]


class Subscription:
    def __init__(
        self,
        address: str,
        permissions: Permissions,
        on_registry: Callable[[Registry], None],
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str = "",
    ) -> None:
        self._address = address
        self._permissions = permissions
        self._on_registry = on_registry
        self._credentials = credentials
        self._server_name = server_name
        self._node = Node(id=f"stoa-mcp/{socket.gethostname()}/{os.getpid()}", cluster="stoa-mcp")
        self.accepted: dict[str, str] = {POLICY_SET_TYPE: "", PERMISSIONS_TYPE: ""}

    def _channel(self) -> grpc.aio.Channel:
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        if self._credentials is None:
            return grpc.aio.insecure_channel(self._address, options=options)
        if self._server_name:
            options.append(("grpc.ssl_target_name_override", self._server_name))
        return grpc.aio.secure_channel(self._address, self._credentials, options=options)

    async def run(self) -> None:
        delay = BACKOFF_INITIAL_S
        while True:
            try:
                if await self._stream():
                    delay = BACKOFF_INITIAL_S
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                log.warning("ads stream ended", extra={"code": exc.code().name, "detail": exc.details()})
            except Exception:
                log.exception("ads stream failed")
            await asyncio.sleep(random.uniform(delay / 2, delay))
            delay = min(delay * 2, BACKOFF_MAX_S)

    async def _stream(self) -> bool:
        handled = False
        async with self._channel() as channel:
            call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
            for type_url in (POLICY_SET_TYPE, PERMISSIONS_TYPE):
                await call.write(self._request(type_url, self.accepted[type_url]))
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return handled
                handled = True
                await call.write(self.apply(response))

    def apply(self, response: DiscoveryResponse) -> DiscoveryRequest:
        type_url = response.type_url
        try:
            if type_url == POLICY_SET_TYPE:
                registry = compile_policy_set(_one(response, mcp_pb2.McpPolicySet))  # type: ignore[arg-type]
                self._on_registry(registry)
                log.info(
                    "tool registry accepted",
                    extra={
                        "version": registry.version,
                        "routes": len(registry.routes),
                        "tools": len(registry.tools),
                    },
                )
            elif type_url == PERMISSIONS_TYPE:
                resource = _one(response, mcp_pb2.ToolPermissions)
                artifact = self._permissions.offer(resource.jws)  # type: ignore[attr-defined]
                log.info(
                    "tool permissions accepted",
                    extra={"seq": artifact.seq, "kid": artifact.kid, "expires_at": artifact.expires_at},
                )
            else:
                raise RegistryError(f"unexpected type {type_url!r}")
        except (RegistryError, Refused) as exc:
            log.warning("refused", extra={"type": type_url.rsplit(".", 1)[-1], "error": str(exc)})
            return self._request(
                type_url,
                self.accepted.get(type_url, ""),
                response.nonce,
                status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=str(exc)),
            )
        self.accepted[type_url] = response.version_info
        return self._request(type_url, response.version_info, response.nonce)

    def _request(
        self, type_url: str, version_info: str, nonce: str = "", error: status_pb2.Status | None = None
    ) -> DiscoveryRequest:
        return DiscoveryRequest(
            node=self._node,
            type_url=type_url,
            resource_names=[RESOURCE_NAME],
            version_info=version_info,
            response_nonce=nonce,
            error_detail=error,
        )
