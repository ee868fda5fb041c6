"""A Check server that decides nothing: the floor of any authorization service behind Envoy.

The same gRPC server as stoa-authz (grpcio's synchronous server, the same thread count and stream
limit) answering every Check with one prepared OK. Envoy's side of the call, the network and grpcio
cost what they cost here too, so `stoa-authz rps ÷ this rps` in one run is the share of the hop that
the service's own work takes away.

    python -m stoa_harness.bench.noop_check 127.0.0.1:9393
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures

import grpc
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from google.rpc import code_pb2, status_pb2

# stoa-authz's defaults (STOA_AUTHZ_GRPC_THREADS, STOA_AUTHZ_GRPC_MAX_CONCURRENT_STREAMS).
THREADS = 4
MAX_CONCURRENT_STREAMS = 1000
_OK = external_auth_pb2.CheckResponse(status=status_pb2.Status(code=code_pb2.OK))


class NoopCheck(external_auth_pb2_grpc.AuthorizationServicer):
    def Check(
        self, request: external_auth_pb2.CheckRequest, context: grpc.ServicerContext
    ) -> external_auth_pb2.CheckResponse:
        return _OK


def main(address: str) -> None:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="check"),
        options=[("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS)],
    )
    external_auth_pb2_grpc.add_AuthorizationServicer_to_server(NoopCheck(), server)
    if server.add_insecure_port(address) == 0:
        raise SystemExit(f"cannot bind {address}")
    server.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    server.stop(1).wait()


if __name__ == "__main__":
    main(sys.argv[1])
