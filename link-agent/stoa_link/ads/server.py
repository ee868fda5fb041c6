"""The ADS gRPC service: binds on loopback with mutual TLS, admits verified clients to their streams,
and publishes snapshots to them.

Clients are identified only by the single URI SAN of their verified certificate (`identity`); each
identity may read only its own resource types (`stream`); `publish` pushes a snapshot in a safe
order and waits for every connected client of each identity to acknowledge it.
"""

from __future__ import annotations

import logging
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from typing import Any

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from stoa_proto import mcp_pb2
from stoa_translate.snapshot import TOOL_PERMISSIONS, Snapshot

from stoa_link.ads.identity import TlsMaterial, peer_identity
from stoa_link.ads.publish import Publisher, PublishResult
from stoa_link.ads.stream import AdsEvent, Streams
from stoa_link.settings import loopback_endpoint

log = logging.getLogger("stoa_link.ads")

# Enough for a 10,000-route RouteConfiguration (≈2.6 MB) with a wide margin.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class AdsServer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """ADS, state of the world and incremental (delta) alike. `identities` maps a URI SAN to the type
    URLs that client may read."""

    def __init__(
        self,
        address: str,
        tls: TlsMaterial,
        identities: Mapping[str, Iterable[str]],
        ack_timeout_s: float = 10.0,
        services: Sequence[Callable[[grpc.aio.Server], None]] = (),
    ) -> None:
        """`services`: more gRPC services to serve on the same authenticated port (each adds itself
        to the server and checks its callers' identity)."""
        self.host, self.port = loopback_endpoint(address)  # refuses anything but loopback
        if not identities:
            raise ValueError("the ADS server needs at least one client identity")
        self._tls = tls
        self._services = tuple(services)
        self._allowed = {san: frozenset(types) for san, types in identities.items() if san}
        self._server: grpc.aio.Server | None = None
        self._streams = Streams(self._allowed)
        self._publisher = Publisher(self._streams, self._allowed, ack_timeout_s)
        self.permissions_seq = 0

    # ---- lifecycle -------------------------------------------------------------------------

    async def start(self) -> int:
        """Bind and serve; returns the bound port (useful with port 0)."""
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
            ]
        )
        ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(self, server)
        for add_to in self._services:
            add_to(server)
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = server.add_secure_port(f"{host}:{self.port}", self._tls.server_credentials())
        if port == 0:
            raise OSError(f"cannot bind the ADS server to {host}:{self.port}")
        await server.start()
        self._server, self.port = server, port
        log.info("ads_listening", extra={"fields": {"address": f"{host}:{port}"}})
        return port

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            self._publisher.cancel_restore()
            self._streams.close_all()
            await self._server.stop(grace)
            self._server = None

    # ---- what is served -----------------------------------------------------------------------

    @property
    def ack_timeout_s(self) -> float:
        return self._publisher.ack_timeout_s

    @property
    def acked_snapshot(self) -> Snapshot | None:
        return self._publisher.acked

    def served_version(self, type_url: str) -> str | None:
        served = self._streams.served(type_url)
        return served.version if served else None

    @property
    def identities(self) -> tuple[str, ...]:
        """The client identities every publication waits for."""
        return tuple(self._allowed)

    def connected(self, identity: str) -> int:
        return self._streams.connected(identity)

    @property
    def events(self) -> deque[AdsEvent]:
        return self._streams.events

    @property
    def nacks(self) -> Counter[str]:
        """NACKs by type URL, for /metrics (the event log is bounded)."""
        return self._streams.nacks

    def event_log(self) -> list[AdsEvent]:
        return self._streams.event_log()

    async def wait_for_clients(self) -> None:
        """Until every client identity has a stream open."""
        await self._publisher.wait_for_clients()

    async def settled(self) -> None:
        """Until no publication, and no restore after a failed one, is under way."""
        await self._publisher.settled()

    async def publish(self, snapshot: Snapshot) -> PublishResult:
        """Serve `snapshot` to every client; SYNCED-worthy only when every client ACKed every type."""
        return await self._publisher.publish(snapshot)

    def serve_permissions(self, seq: int, jws: str) -> bool:
        """Serve the CP's signed tool permissions to the MCP module, unless they are older than those
        served already (the Link never serves an older artifact: a replayed event is dropped)."""
        if seq <= self.permissions_seq:
            log.info(
                "tool_permissions_not_newer",
                extra={"fields": {"seq": seq, "served_seq": self.permissions_seq}},
            )
            return False
        self.permissions_seq = seq
        resource = mcp_pb2.ToolPermissions(name="default", version=str(seq), seq=seq, jws=jws)
        self._streams.serve(TOOL_PERMISSIONS, str(seq), (resource,))
        log.info("tool_permissions_served", extra={"fields": {"seq": seq}})
        return True

    # ---- the gRPC service -----------------------------------------------------------------------

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        await self._serve(request_iterator, context, delta=False)

    async def _serve(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext, *, delta: bool
    ) -> None:
        identity, why = peer_identity(context)
        if identity is None or identity not in self._allowed:
            # An unknown identity gets nothing at all, not even an empty configuration.
            reason = why or f"identity {identity} is not allowed"
            self._streams.record("refuse", identity or "", detail=reason)
            log.warning(
                "ads_refused",
                extra={"fields": {"peer": context.peer(), "identity": identity, "reason": reason}},
            )
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)
            return
        await self._streams.run(identity, request_iterator, context, delta=delta)

    async def DeltaAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DeltaDiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        await self._serve(request_iterator, context, delta=True)
