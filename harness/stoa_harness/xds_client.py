"""A Python xDS client standing in for Envoy or a site service, for tests of the Link's ADS server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.rpc import status_pb2
from stoa_link import certs


class XdsClient:
    """A minimal state-of-the-world xDS client over mutual TLS: subscribes, then ACKs or NACKs
    whatever arrives (per type), standing in for Envoy or a site service in tests."""

    def __init__(
        self, tls_dir: Path, port: int, cert: str = "envoy-client", issued: certs.Issued | None = None
    ) -> None:
        ca = (tls_dir / certs.CA_FILE).read_bytes()
        cert_pem = issued.cert_pem if issued else (tls_dir / f"{cert}.pem").read_bytes()
        key_pem = issued.key_pem if issued else (tls_dir / f"{cert}-key.pem").read_bytes()
        creds = grpc.ssl_channel_credentials(ca, key_pem, cert_pem)
        self.channel = grpc.aio.secure_channel(f"localhost:{port}", creds)
        self.requests: asyncio.Queue[discovery_pb2.DiscoveryRequest | None] = asyncio.Queue()
        self.received: list[discovery_pb2.DiscoveryResponse] = []
        self.nack: dict[str, str] = {}  # type URL -> the version to refuse
        self.silent: set[str] = set()
        self.error: grpc.aio.AioRpcError | None = None
        self.call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(self.channel).StreamAggregatedResources(
            self._requests()
        )
        self.task = asyncio.create_task(self._loop())

    async def _requests(self) -> AsyncIterator[discovery_pb2.DiscoveryRequest]:
        while (item := await self.requests.get()) is not None:
            yield item

    def subscribe(self, *types: str) -> None:
        for type_url in types:
            self.requests.put_nowait(discovery_pb2.DiscoveryRequest(type_url=type_url, node={"id": "node-1"}))

    async def _loop(self) -> None:
        try:
            async for response in self.call:
                self.received.append(response)
                if response.type_url in self.silent:
                    continue
                request = discovery_pb2.DiscoveryRequest(
                    type_url=response.type_url, response_nonce=response.nonce
                )
                if self.nack.get(response.type_url) == response.version_info:
                    request.error_detail.CopyFrom(
                        status_pb2.Status(code=3, message=f"bad {response.version_info}")
                    )
                else:
                    request.version_info = response.version_info
                self.requests.put_nowait(request)
        except grpc.aio.AioRpcError as exc:
            self.error = exc

    def versions(self, type_url: str) -> list[str]:
        return [r.version_info for r in self.received if r.type_url == type_url]

    async def close(self) -> None:
        self.requests.put_nowait(None)
        self.call.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.channel.close()
