"""An ExternalProcessor that changes nothing: the floor of any processing service behind Envoy.

The same gRPC server as stoa-proc (grpcio's asyncio server, the same message limit) answering each
message with the prepared "continue" of its phase, and switching a server-sent event stream to
streamed mode at its response headers as stoa-proc does (so both receive the same messages). Envoy's
side of the stream, the network and grpcio cost what they cost here too, so stoa-proc's figures ÷
these in one run are the share of the hop that the service's own work takes away.

    python -m stoa_harness.bench.noop_proc 127.0.0.1:9291
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import AsyncIterator

import grpc
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyResponse,
    HeadersResponse,
    ProcessingRequest,
    ProcessingResponse,
    TrailersResponse,
)

# stoa-proc's default: twice its body limit (1 MiB) and some room.
MAX_MESSAGE = 2 * 1024 * 1024 + 65536
_CONTINUE = {
    "request_headers": ProcessingResponse(request_headers=HeadersResponse()),
    "request_body": ProcessingResponse(request_body=BodyResponse()),
    "response_headers": ProcessingResponse(response_headers=HeadersResponse()),
    "response_body": ProcessingResponse(response_body=BodyResponse()),
    "request_trailers": ProcessingResponse(request_trailers=TrailersResponse()),
    "response_trailers": ProcessingResponse(response_trailers=TrailersResponse()),
}
_STREAMED = ProcessingResponse(
    response_headers=HeadersResponse(),
    mode_override=ProcessingMode(response_body_mode=ProcessingMode.STREAMED),
)


def _event_stream(request: ProcessingRequest) -> bool:
    for header in request.response_headers.headers.headers:
        if header.key.lower() == "content-type":
            value = header.raw_value.decode("latin-1") if header.raw_value else header.value
            return value.startswith("text/event-stream")
    return False


class NoopProcessor(external_processor_pb2_grpc.ExternalProcessorServicer):
    async def Process(
        self, request_iterator: AsyncIterator[ProcessingRequest], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[ProcessingResponse]:
        async for request in request_iterator:
            phase = request.WhichOneof("request") or ""
            if phase == "response_headers" and _event_stream(request):
                yield _STREAMED
            else:
                yield _CONTINUE[phase]


async def main(address: str) -> None:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", MAX_MESSAGE)])
    external_processor_pb2_grpc.add_ExternalProcessorServicer_to_server(NoopProcessor(), server)
    if server.add_insecure_port(address) == 0:
        raise SystemExit(f"cannot bind {address}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(1)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
