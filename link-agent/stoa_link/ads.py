"""The ADS server: state-of-the-world xDS over mutual TLS on loopback, with ACK/NACK tracking.

Clients are identified only by the single URI SAN of their verified certificate; each identity may
read only its own resource types. `publish` pushes a snapshot in a safe order and waits for every
connected client of each identity to acknowledge it; on a NACK or a missed deadline it puts the last
acknowledged snapshot back everywhere.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message

from stoa_link import certs
from stoa_link.settings import loopback_endpoint
from stoa_link.snapshot import (
    CLUSTER,
    ENVOY_TYPES,
    LISTENER,
    ROUTE,
    SITE_SERVICE_TYPES,
    Snapshot,
    resource_name,
)

log = logging.getLogger("stoa_link.ads")

# Enough for a 10,000-route RouteConfiguration (≈2.6 MB) with a wide margin.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
SHORT_NAMES = {CLUSTER: "CDS", LISTENER: "LDS", ROUTE: "RDS"}


def short(type_url: str) -> str:
    return SHORT_NAMES.get(type_url, type_url.rsplit(".", 1)[-1])


@dataclass(frozen=True)
class TlsMaterial:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def server_from_dir(cls, tls_dir: Path) -> TlsMaterial:
        paths = [tls_dir / certs.CA_FILE, tls_dir / certs.SERVER_CERT_FILE, tls_dir / certs.SERVER_KEY_FILE]
        missing = [str(p) for p in paths if not p.is_file()]
        if missing:
            raise FileNotFoundError(
                f"ADS TLS files missing: {', '.join(missing)} (create them with `stoa-link certs --out DIR`)"
            )
        return cls(*(p.read_bytes() for p in paths))


@dataclass(frozen=True)
class PublishResult:
    acked: bool
    version: str
    # On failure: "NACK" or "ACK_TIMEOUT", the type that failed and Envoy's (or the client's) error detail.
    reason: str = ""
    failed_type: str = ""
    detail: str = ""
    # Milliseconds per stage (packing, each ACK wait), for the Link's logs.
    timings: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AdsEvent:
    """One thing the server did or saw; the record tests use to check ordering."""

    seq: int
    at: float
    kind: str  # connect | disconnect | refuse | subscribe | send | ack | nack
    identity: str = ""
    type_url: str = ""
    version: str = ""
    nonce: str = ""
    names: tuple[str, ...] = ()
    detail: str = ""


@dataclass
class _TypeState:
    subscribed: bool = False
    names: frozenset[str] = frozenset()
    sent_nonce: str = ""
    sent_version: str | None = None
    sent_digest: str = ""  # content of the latest push (see _digest)
    acked_nonce: str = ""
    nack_detail: str | None = None  # set when the latest push was refused
    sent_at: float = 0.0  # monotonic time of the latest push, and of its ACK
    acked_at: float = 0.0


@dataclass(frozen=True)
class _Close:
    code: grpc.StatusCode | None = None
    message: str = ""


@dataclass
class _Stream:
    sid: int
    identity: str
    allowed: frozenset[str]
    queue: asyncio.Queue[discovery_pb2.DiscoveryResponse | _Close] = field(default_factory=asyncio.Queue)
    types: dict[str, _TypeState] = field(default_factory=dict)
    node_id: str = ""

    def state(self, type_url: str) -> _TypeState:
        return self.types.setdefault(type_url, _TypeState())


@dataclass(frozen=True)
class _Served:
    version: str
    resources: tuple[Message, ...]
    packed: tuple[any_pb2.Any, ...]
    digest: str


def _pack(type_url: str, resources: Iterable[Message]) -> tuple[tuple[any_pb2.Any, ...], str]:
    """The resources packed for a response, and the digest of their content.

    One deterministic serialisation feeds both. A site service's policy set is identified by its
    name and its own `version` (the hash of what the service decides on), not by the generation it
    also carries: the service keeps the set it loaded for a known version anyway
    (stoa_authz.policy.PolicyStore), so re-sending it for a new generation only costs a reload.
    """
    digest = hashlib.sha256()
    packed = []
    for res in resources:
        body = res.SerializeToString(deterministic=True)
        packed.append(any_pb2.Any(type_url=f"type.googleapis.com/{res.DESCRIPTOR.full_name}", value=body))
        if type_url in SITE_SERVICE_TYPES and getattr(res, "version", ""):
            body = f"{resource_name(res)}\n{res.version}".encode()  # type: ignore[attr-defined]
        digest.update(len(body).to_bytes(8, "big"))
        digest.update(body)
    return tuple(packed), digest.hexdigest()


def elapsed_ms(since: float) -> float:
    """Milliseconds since `since` (a `time.perf_counter()` reading), for stage timings in logs."""
    return round((time.perf_counter() - since) * 1000, 2)


def _identity(context: grpc.aio.ServicerContext) -> tuple[str | None, str]:
    """The client's single URI SAN from its verified chain, or None with the reason it has none."""
    auth = context.auth_context()
    tls_version = [v.decode() for v in auth.get("ssl_tls_version", [])]
    if tls_version != ["TLSv1.3"]:
        return None, f"TLS 1.3 required (client negotiated {tls_version or 'no TLS'})"
    sans = [v.decode() for v in auth.get("x509_subject_alternative_name", [])]
    uris = [v.decode() for v in auth.get("peer_uri", [])] or [s for s in sans if "://" in s]
    if len(uris) != 1:
        return None, f"client certificate must carry exactly one URI SAN (found {len(uris)})"
    return uris[0], ""


class AdsServer(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """State-of-the-world ADS. `identities` maps a URI SAN to the type URLs that client may read."""

    def __init__(
        self,
        address: str,
        tls: TlsMaterial,
        identities: Mapping[str, Iterable[str]],
        ack_timeout_s: float = 10.0,
    ) -> None:
        self.host, self.port = loopback_endpoint(address)  # refuses anything but loopback
        if not identities:
            raise ValueError("the ADS server needs at least one client identity")
        self._tls = tls
        self._allowed = {san: frozenset(types) for san, types in identities.items() if san}
        self.ack_timeout_s = ack_timeout_s
        self._server: grpc.aio.Server | None = None
        self._streams: dict[int, _Stream] = {}
        self._served: dict[str, _Served] = {}
        self._acked: Snapshot | None = None
        self._publish_lock = asyncio.Lock()
        self._changed = asyncio.Event()
        self._sids = itertools.count(1)
        self._nonces = itertools.count(1)
        self._seq = itertools.count(1)
        self.events: deque[AdsEvent] = deque(maxlen=50_000)
        self.nacks: Counter[str] = Counter()  # by type URL, for /metrics (the event log is bounded)

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
        creds = grpc.ssl_server_credentials(
            [(self._tls.key_pem, self._tls.cert_pem)],
            root_certificates=self._tls.ca_pem,
            require_client_auth=True,
        )
        host = f"[{self.host}]" if ":" in self.host else self.host
        port = server.add_secure_port(f"{host}:{self.port}", creds)
        if port == 0:
            raise OSError(f"cannot bind the ADS server to {host}:{self.port}")
        await server.start()
        self._server, self.port = server, port
        log.info("ads_listening", extra={"fields": {"address": f"{host}:{port}"}})
        return port

    async def stop(self, grace: float = 1.0) -> None:
        if self._server is not None:
            for stream in list(self._streams.values()):
                stream.queue.put_nowait(_Close())
            await self._server.stop(grace)
            self._server = None

    # ---- what is served -----------------------------------------------------------------------

    @property
    def acked_snapshot(self) -> Snapshot | None:
        return self._acked

    def served_version(self, type_url: str) -> str | None:
        served = self._served.get(type_url)
        return served.version if served else None

    @property
    def identities(self) -> tuple[str, ...]:
        """The client identities every publication waits for."""
        return tuple(self._allowed)

    def connected(self, identity: str) -> int:
        return sum(1 for s in self._streams.values() if s.identity == identity)

    def event_log(self) -> list[AdsEvent]:
        return list(self.events)

    async def wait_for_clients(self) -> None:
        while not all(self.connected(i) for i in self._allowed):
            await self._next_change(None)

    # ---- publication --------------------------------------------------------------------------

    async def publish(self, snapshot: Snapshot) -> PublishResult:
        """Serve `snapshot` to every client; SYNCED-worthy only when every client ACKed every type."""
        async with self._publish_lock:
            started = time.perf_counter()
            await self.wait_for_clients()
            timings: dict[str, float] = {"clients_ms": elapsed_ms(started)}
            result = await self._apply(snapshot, timings)
            timings["publish_ms"] = elapsed_ms(started)
            result = dataclasses.replace(result, timings=timings)
            if result.acked:
                self._acked = snapshot
                log.info(
                    "ads_published",
                    extra={"fields": {"version": snapshot.version, "generation": snapshot.generation}},
                )
                return result
            log.warning(
                "ads_publish_failed",
                extra={
                    "fields": {
                        "version": snapshot.version,
                        "reason": result.reason,
                        "type": short(result.failed_type),
                        "detail": result.detail,
                    }
                },
            )
            await self._restore()
            return result

    async def _restore(self) -> None:
        if self._acked is None:
            # Nothing was ever acknowledged: stop offering the refused content to clients that connect.
            self._served.clear()
            return
        back = await self._apply(self._acked, {})
        if not back.acked:
            log.error(
                "ads_restore_failed",
                extra={
                    "fields": {
                        "version": self._acked.version,
                        "reason": back.reason,
                        "type": short(back.failed_type),
                        "detail": back.detail,
                    }
                },
            )

    def _readers(self, types: Iterable[str]) -> list[str]:
        wanted = set(types)
        return [san for san, allowed in self._allowed.items() if allowed & wanted]

    async def _apply(self, snapshot: Snapshot, timings: dict[str, float]) -> PublishResult:
        version = snapshot.version
        # Site services first: a route must never reach Envoy before its policy set is in force.
        for type_url in SITE_SERVICE_TYPES:
            readers = self._readers([type_url])
            if not readers or type_url not in snapshot.resources:
                continue
            mark = time.perf_counter()
            digest = self._serve(type_url, version, snapshot.of(type_url))
            timings[f"{short(type_url)}_serve_ms"] = elapsed_ms(mark)
            failure = await self._wait_acked({type_url: digest}, readers, version)
            timings[f"{short(type_url)}_ack_ms"] = elapsed_ms(mark)
            if failure:
                return failure
        readers = self._readers(ENVOY_TYPES)
        if not readers:
            return PublishResult(True, version)
        # Clusters leave only after the routes that stop using them are acknowledged: first serve
        # the union of the clusters served so far and the new ones, then the new ones alone.
        new_clusters = {resource_name(c): c for c in snapshot.of(CLUSTER)}
        previous = self._served.get(CLUSTER)
        union = {resource_name(c): c for c in (previous.resources if previous else ())} | new_clusters
        cds_version = version if union.keys() == new_clusters.keys() else f"{version}+{previous.version}"  # type: ignore[union-attr]
        mark, pushed_at = time.perf_counter(), time.monotonic()
        targets = {
            CLUSTER: self._serve(CLUSTER, cds_version, tuple(union[n] for n in sorted(union))),
            LISTENER: self._serve(LISTENER, version, snapshot.of(LISTENER)),
            ROUTE: self._serve(ROUTE, version, snapshot.of(ROUTE)),
        }
        timings["envoy_serve_ms"] = elapsed_ms(mark)
        failure = await self._wait_acked(targets, readers, version)
        timings["envoy_ack_ms"] = elapsed_ms(mark)
        timings.update(self._ack_times(targets, readers, since=pushed_at))
        if failure:
            return failure
        if cds_version != version:
            mark = time.perf_counter()
            digest = self._serve(CLUSTER, version, snapshot.of(CLUSTER))
            failure = await self._wait_acked({CLUSTER: digest}, readers, version)
            timings["cds_removal_ack_ms"] = elapsed_ms(mark)
            if failure:
                return failure
        return PublishResult(True, version)

    def _ack_times(self, targets: Mapping[str, str], readers: list[str], since: float) -> dict[str, float]:
        """Per type pushed after `since` (monotonic), the slowest stream's push-to-ACK time (ms)."""
        out: dict[str, float] = {}
        for stream in self._streams.values():
            if stream.identity not in readers:
                continue
            for type_url in targets:
                state = stream.types.get(type_url)
                if state is not None and state.acked_nonce == state.sent_nonce and state.sent_at >= since:
                    key = f"{short(type_url)}_push_to_ack_ms"
                    out[key] = max(out.get(key, 0.0), round((state.acked_at - state.sent_at) * 1000, 2))
        return out

    def _serve(self, type_url: str, version: str, resources: tuple[Message, ...]) -> str:
        """Serve `resources` as `version` from now on; the digest of their content.

        A subscribed stream whose latest push already carries this content (acknowledged or still
        in flight, not refused) is not pushed again: state of the world allows leaving a type
        alone, and a 10,000-route table or a large policy set costs its client a full reload. A
        client connecting later gets `version`.
        """
        packed, digest = _pack(type_url, resources)
        self._served[type_url] = _Served(version, resources, packed, digest)
        for stream in list(self._streams.values()):
            state = stream.types.get(type_url)
            if type_url in stream.allowed and state is not None and state.subscribed:
                if state.sent_digest == digest and state.nack_detail is None:
                    continue
                self._send(stream, type_url)
        return digest

    def _send(self, stream: _Stream, type_url: str) -> None:
        served = self._served[type_url]
        nonce = str(next(self._nonces))
        state = stream.state(type_url)
        state.sent_nonce, state.sent_version, state.nack_detail = nonce, served.version, None
        state.sent_digest = served.digest
        state.sent_at = time.monotonic()
        stream.queue.put_nowait(
            discovery_pb2.DiscoveryResponse(
                version_info=served.version, resources=served.packed, type_url=type_url, nonce=nonce
            )
        )
        self._record(
            "send",
            stream.identity,
            type_url,
            served.version,
            nonce,
            tuple(resource_name(r) for r in served.resources),
        )

    async def _wait_acked(
        self, targets: Mapping[str, str], readers: list[str], version: str
    ) -> PublishResult | None:
        """None once every stream of every reader acknowledged each target (type URL → content
        digest, see `_serve`); a failure otherwise."""
        deadline = time.monotonic() + self.ack_timeout_s
        while True:
            pending: list[str] = []
            for identity in readers:
                streams = [s for s in self._streams.values() if s.identity == identity]
                if not streams:
                    pending.append(f"{identity} (not connected)")
                for stream in streams:
                    for type_url, want in targets.items():
                        if type_url not in stream.allowed:
                            continue
                        state = stream.state(type_url)
                        if state.sent_digest == want and state.nack_detail is not None:
                            return PublishResult(False, version, "NACK", type_url, state.nack_detail)
                        if not (state.sent_digest == want and state.acked_nonce == state.sent_nonce):
                            served = self._served[type_url].version
                            pending.append(f"{short(type_url)} {served} from {identity}")
            if not pending:
                return None
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                detail = f"no ACK within {self.ack_timeout_s:g}s for: {', '.join(pending)}"
                first_type = next(iter(targets))
                for type_url in targets:
                    if any(short(type_url) in p for p in pending):
                        first_type = type_url
                        break
                return PublishResult(False, version, "ACK_TIMEOUT", first_type, detail)
            await self._next_change(remaining)

    async def _next_change(self, wait_s: float | None) -> None:
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), wait_s)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _record(
        self,
        kind: str,
        identity: str = "",
        type_url: str = "",
        version: str = "",
        nonce: str = "",
        names: tuple[str, ...] = (),
        detail: str = "",
    ) -> None:
        self.events.append(
            AdsEvent(
                next(self._seq), time.monotonic(), kind, identity, type_url, version, nonce, names, detail
            )
        )

    # ---- the gRPC service -----------------------------------------------------------------------

    async def StreamAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        identity, why = _identity(context)
        peer = context.peer()
        if identity is None or identity not in self._allowed:
            # An unknown identity gets nothing at all, not even an empty configuration.
            reason = why or f"identity {identity} is not allowed"
            self._record("refuse", identity or "", detail=reason)
            log.warning(
                "ads_refused", extra={"fields": {"peer": peer, "identity": identity, "reason": reason}}
            )
            await context.abort(grpc.StatusCode.PERMISSION_DENIED, reason)
            return
        stream = _Stream(next(self._sids), identity, self._allowed[identity])
        self._streams[stream.sid] = stream
        self._record("connect", identity)
        log.info(
            "ads_connected", extra={"fields": {"identity": identity, "peer": peer, "stream": stream.sid}}
        )
        self._notify()
        reader = asyncio.create_task(self._read(stream, request_iterator))
        try:
            while True:
                item = await stream.queue.get()
                if isinstance(item, _Close):
                    if item.code is not None:
                        await context.abort(item.code, item.message)
                    return
                await context.write(item)
        finally:
            reader.cancel()
            del self._streams[stream.sid]
            self._record("disconnect", identity)
            log.info("ads_disconnected", extra={"fields": {"identity": identity, "stream": stream.sid}})
            self._notify()

    async def DeltaAggregatedResources(
        self,
        request_iterator: AsyncIterator[discovery_pb2.DeltaDiscoveryRequest],
        context: grpc.aio.ServicerContext,
    ) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "only state-of-the-world ADS is served")

    async def _read(self, stream: _Stream, requests: AsyncIterator[discovery_pb2.DiscoveryRequest]) -> None:
        try:
            async for request in requests:
                refusal = self._on_request(stream, request)
                if refusal:
                    stream.queue.put_nowait(_Close(grpc.StatusCode.PERMISSION_DENIED, refusal))
                    return
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            raise
        except Exception:  # a broken client stream must end the stream, never the server
            log.exception("ads_stream_error", extra={"fields": {"identity": stream.identity}})
        stream.queue.put_nowait(_Close())

    def _on_request(self, stream: _Stream, request: discovery_pb2.DiscoveryRequest) -> str | None:
        type_url = request.type_url
        if request.node.id and not stream.node_id:
            # Logged for operators; never an authentication input.
            stream.node_id = request.node.id
            log.info("ads_node", extra={"fields": {"identity": stream.identity, "node_id": request.node.id}})
        if type_url not in stream.allowed:
            self._record("refuse", stream.identity, type_url, detail="type not allowed for this identity")
            return f"{stream.identity} may not read {type_url}"
        state = stream.state(type_url)
        names = frozenset(request.resource_names)
        new_names = bool(names - state.names)
        state.names = names
        if not request.response_nonce:
            state.subscribed = True
            self._record(
                "subscribe", stream.identity, type_url, request.version_info, names=tuple(sorted(names))
            )
            if type_url in self._served:
                self._send(stream, type_url)
            self._notify()
            return None
        if request.response_nonce != state.sent_nonce:
            return None  # about an older push; the answer to the latest one is still to come
        if request.HasField("error_detail"):
            state.nack_detail = request.error_detail.message or f"NACK (code {request.error_detail.code})"
            self.nacks[type_url] += 1
            self._record(
                "nack",
                stream.identity,
                type_url,
                state.sent_version or "",
                request.response_nonce,
                detail=state.nack_detail,
            )
        else:
            state.acked_nonce = request.response_nonce
            state.acked_at = time.monotonic()
            self._record("ack", stream.identity, type_url, state.sent_version or "", request.response_nonce)
            if new_names and type_url in self._served:
                # The client asks for names it did not hold when the last push arrived: resend.
                self._send(stream, type_url)
        self._notify()
        return None
