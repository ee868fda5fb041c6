"""An ADS server standing in for the Link where a site service runs alone (its tests, the CPU
benches): it serves one complete policy set, over state of the world or delta xDS, whichever the
service asks for, and counts the ACKs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
)
from google.protobuf import symbol_database


def delta_of(response: DiscoveryResponse) -> DeltaDiscoveryResponse:
    """`response` as a delta response carrying every resource, each under its own `name`."""
    delta = DeltaDiscoveryResponse(
        type_url=response.type_url, system_version_info=response.version_info, nonce=response.nonce
    )
    for packed in response.resources:
        message = symbol_database.Default().GetSymbol(packed.TypeName())()
        packed.Unpack(message)
        delta.resources.add(name=message.name, version=response.version_info, resource=packed)
    return delta


class OneSetAds(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, response: DiscoveryResponse) -> None:
        self.response = response
        self.acks = 0

    async def _serve(
        self, requests: AsyncIterator[DiscoveryRequest | DeltaDiscoveryRequest], first: object
    ) -> AsyncIterator[object]:
        async def count() -> None:
            async for request in requests:
                if request.response_nonce and not request.HasField("error_detail"):
                    self.acks += 1

        reader = asyncio.ensure_future(count())
        try:
            yield first
            await asyncio.Event().wait()  # hold the stream open until the server stops
        finally:
            reader.cancel()

    # Async generators themselves: grpc's asyncio server streams the answers of those alone.
    async def StreamAggregatedResources(
        self, request_iterator: AsyncIterator[DiscoveryRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[object]:
        async for response in self._serve(request_iterator, self.response):
            yield response

    async def DeltaAggregatedResources(
        self, request_iterator: AsyncIterator[DeltaDiscoveryRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[object]:
        async for response in self._serve(request_iterator, delta_of(self.response)):
            yield response
