"""The xDS protocols, state of the world and incremental (delta), per client stream: subscriptions
per type, what was pushed under which nonce, and which pushes each stream acknowledged or refused.

`Streams` holds every open stream and the content currently served per type. It pushes content to
the streams that subscribed to its type, answers a (re)subscription with what is served, and turns
each request carrying a nonce into an ACK or a NACK of that push. It knows nothing of publication
order; `publish` decides what to serve when and reads back the progress from here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import logging
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import grpc
from envoy.service.discovery.v3 import discovery_pb2
from google.protobuf import any_pb2
from google.protobuf.message import Message
from stoa_proto.inventory_delta import MODULUS, tagged_digest
from stoa_translate.snapshot import (
    CLUSTER,
    LISTENER,
    ROUTE,
    SCOPED_ROUTE,
    SITE_SERVICE_TYPES,
    TOOL_PERMISSIONS,
    resource_name,
)

log = logging.getLogger("stoa_link.ads")

SHORT_NAMES = {CLUSTER: "CDS", LISTENER: "LDS", ROUTE: "RDS", SCOPED_ROUTE: "SRDS"}


def short(type_url: str) -> str:
    return SHORT_NAMES.get(type_url, type_url.rsplit(".", 1)[-1])


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
    sent_digest: str = ""  # content of the latest push (see _pack)
    acked_nonce: str = ""
    nack_detail: str | None = None  # set when the latest push was refused
    sent_at: float = 0.0  # monotonic time of the latest push, and of its ACK
    acked_at: float = 0.0
    # Delta xDS: the client asked for every resource of the type (no names), and what it holds by
    # name (its initial versions, then what was sent to it).
    wildcard: bool = False
    known: dict[str, str] = field(default_factory=dict)
    # The names pushes removed since the client last acknowledged one: it still holds them if it
    # refuses the push (a refused response changes nothing it holds).
    dropped: set[str] = field(default_factory=set)
    # The serial of the Served this stream's `known` was last brought level with (by a push or a
    # finding that nothing differs); None once a request changed what it asks for or holds.
    level_with: int | None = None


@dataclass(frozen=True)
class _Close:
    code: grpc.StatusCode | None = None
    message: str = ""


@dataclass
class _Stream:
    sid: int
    identity: str
    allowed: frozenset[str]
    queue: asyncio.Queue[discovery_pb2.DiscoveryResponse | discovery_pb2.DeltaDiscoveryResponse | _Close] = (
        field(default_factory=asyncio.Queue)
    )
    types: dict[str, _TypeState] = field(default_factory=dict)
    node_id: str = ""
    delta: bool = False  # incremental xDS (DeltaAggregatedResources) rather than state of the world

    def state(self, type_url: str) -> _TypeState:
        return self.types.setdefault(type_url, _TypeState())


@dataclass(frozen=True)
class Served:
    """The content served for one type: what a subscribing stream gets."""

    version: str
    resources: tuple[Message, ...]
    # Each resource as packed, by name (see `_pack`).
    entries: Mapping[str, _Packed]
    digest: str
    # Delta xDS: each resource's own version, by name (see `Streams.serve`).
    versions: Mapping[str, str] = field(default_factory=dict)
    # Its own serial; and when it followed a snapshot's edits of the one it replaced, that one's serial
    # (`since`, not the object: no chain of past contents is kept alive), the names pushed anew and the
    # names gone, so a stream level with `since` is brought level by those alone.
    serial: int = 0
    since: int | None = None
    changed: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()
    # Delta xDS: names a client need not hold unless it asks for them (`Snapshot.on_request`).
    on_request: frozenset[str] = frozenset()

    @functools.cached_property
    def packed(self) -> tuple[any_pb2.Any, ...]:
        """Every resource packed, in order (a state-of-the-world response)."""
        return tuple(self.entries[resource_name(r)][1] for r in self.resources)


@dataclass(frozen=True)
class Progress:
    """Where the streams of some identities stand on some pushes (see `Streams.progress`)."""

    nack: tuple[str, str] | None  # (type URL, the client's error detail) of a refused push
    pending: list[str]  # what is still unacknowledged, readable ("RDS v1 from spiffe://…")
    missing: list[str]  # the readers with no stream open


# One resource as packed: (the object, its Any, its name, the hash of its content, its share of the
# type's digest).
_Packed = tuple[Message, any_pb2.Any, str, str, int]


def _packed(type_url: str, res: Message, bodies: Mapping[int, bytes] | None) -> _Packed:
    """One resource packed from the deterministic serialisation (`bodies`: those the snapshot made, by
    object identity). A site service's policy set is identified by its name and its own `version` (the
    hash of its content), so a set rebuilt with the same content is not hashed whole again."""
    body = bodies.get(id(res)) if bodies else None
    if body is None:
        body = res.SerializeToString(deterministic=True)
    wrapped = any_pb2.Any(type_url=f"type.googleapis.com/{res.DESCRIPTOR.full_name}", value=body)
    if type_url in SITE_SERVICE_TYPES and getattr(res, "version", ""):
        body = f"{resource_name(res)}\n{res.version}".encode()  # type: ignore[attr-defined]
    name = resource_name(res)
    content = hashlib.sha256(body).hexdigest()[:16]
    share = tagged_digest(name, content.encode())
    return (res, wrapped, name, content, share)


def _digest(total: int) -> str:
    """A type's content digest from the sum of its resources' shares (names and content hashes):
    order-free and additive, so following an edit updates it for what changed."""
    return (total % MODULUS).to_bytes(32, "big").hex()


def _pack(
    type_url: str,
    resources: Iterable[Message],
    bodies: Mapping[int, bytes] | None = None,
    previous: Mapping[int, _Packed] | None = None,
) -> tuple[dict[str, _Packed], int, dict[int, _Packed]]:
    """The resources packed by name, the sum of their shares, and what was packed by object identity
    (`previous` for the next call): an object packed by the previous call is taken as it was
    (snapshots never change a resource they hold), so 10,000 unchanged scopes cost a look-up each."""
    entries: dict[str, _Packed] = {}
    memo: dict[int, _Packed] = {}
    total = 0
    for res in resources:
        hit = previous.get(id(res)) if previous else None
        if hit is None or hit[0] is not res:
            hit = _packed(type_url, res, bodies)
        memo[id(res)] = hit
        entries[hit[2]] = hit
        total += hit[4]
    return entries, total, memo


class Streams:
    """Every open ADS stream. `allowed` maps a client identity to the type URLs it may read."""

    def __init__(self, allowed: Mapping[str, frozenset[str]]) -> None:
        self._allowed = allowed
        self._streams: dict[int, _Stream] = {}
        self._served: dict[str, Served] = {}
        # Per type, what the latest serve packed, by object identity (see `_pack`).
        self._packed: dict[str, dict[int, _Packed]] = {}
        # Per type, per resource name: (content hash, the version it has been served under since).
        self._lineage: dict[str, dict[str, tuple[str, str]]] = {}
        self._totals: dict[str, int] = {}  # per type, the sum of the served resources' shares
        self._changed = asyncio.Event()
        self._sids = itertools.count(1)
        self._nonces = itertools.count(1)
        self._serials = itertools.count(1)
        self._seq = itertools.count(1)
        self.events: deque[AdsEvent] = deque(maxlen=50_000)
        self.nacks: Counter[str] = Counter()  # by type URL, for /metrics (the event log is bounded)

    # ---- what is served -----------------------------------------------------------------------

    def served(self, type_url: str) -> Served | None:
        return self._served.get(type_url)

    def withdraw(self) -> None:
        """Serve no configuration: a client that connects from now on gets none. The signed tool
        permissions stay: they are not part of any snapshot (the module verifies them itself)."""
        for type_url in list(self._served):
            if type_url != TOOL_PERMISSIONS:
                del self._served[type_url]

    def serve(
        self,
        type_url: str,
        version: str,
        resources: tuple[Message, ...],
        bodies: Mapping[int, bytes] | None = None,
        edit: tuple[tuple[Message, ...], tuple[Message, ...], tuple[Message, ...]] | None = None,
        on_request: frozenset[str] = frozenset(),
    ) -> str:
        """Serve `resources` as `version` from now on; the digest of their content.

        A subscribed stream whose latest push already carries this content (acknowledged or still
        in flight, not refused) is not pushed again: state of the world allows leaving a type
        alone, and a 10,000-route table or a large policy set costs its client a full reload. A
        client connecting later gets `version`. `edit`: (the resources served until now, what left
        them, what joined them), as the snapshot says (`Snapshot.edits`): then only those are looked
        at, here and for every delta stream level with what was served.
        """
        previous = self._served.get(type_url)
        lineage = self._lineage.setdefault(type_url, {})
        memo = self._packed.get(type_url)
        if edit is not None and previous is not None and previous.resources is edit[0] and memo is not None:
            # Followed in place: the previous Served is not served again once replaced.
            entries, versions = dict(previous.entries), dict(previous.versions)
            total = self._totals[type_url]
            changed: set[str] = set()
            removed: set[str] = set()
            for res in edit[1]:
                hit = memo.pop(id(res), None)
                if hit is not None and entries.get(hit[2]) is hit:
                    del entries[hit[2]], versions[hit[2]]
                    total -= hit[4]
                    removed.add(hit[2])
            for res in edit[2]:
                hit = _packed(type_url, res, bodies)
                memo[id(res)] = entries[hit[2]] = hit
                total += hit[4]
                changed.add(hit[2])
                removed.discard(hit[2])
                if hit[2] not in lineage or lineage[hit[2]][0] != hit[3]:
                    lineage[hit[2]] = (hit[3], version)
                versions[hit[2]] = lineage[hit[2]][1]
            for name in removed:
                lineage.pop(name, None)
            since: int | None = previous.serial
        else:
            entries, total, self._packed[type_url] = _pack(type_url, resources, bodies, memo)
            # A resource's delta version is the version it was first served under with its content,
            # so an unchanged resource keeps its version (Envoy reports what a state-of-the-world push
            # would have set) and a client reconnecting with it gets nothing again.
            for name in set(lineage) - entries.keys():
                del lineage[name]
            for name, hit in entries.items():
                if name not in lineage or lineage[name][0] != hit[3]:
                    lineage[name] = (hit[3], version)
            versions = {name: lineage[name][1] for name in entries}
            since, changed, removed = None, set(), set()
        serial = next(self._serials)
        served = Served(
            version,
            resources,
            entries,
            _digest(total),
            versions,
            serial,
            since,
            frozenset(changed),
            frozenset(removed),
            on_request,
        )
        self._totals[type_url] = total
        self._served[type_url] = served
        for stream in list(self._streams.values()):
            state = stream.types.get(type_url)
            if type_url in stream.allowed and state is not None and state.subscribed:
                if state.sent_digest == served.digest and state.nack_detail is None:
                    if previous is not None and state.level_with == previous.serial:
                        state.level_with = served.serial
                    continue
                self._send(stream, type_url)
        return served.digest

    def _send(self, stream: _Stream, type_url: str) -> None:
        if stream.delta:
            self._send_delta(stream, type_url)
            return
        served = self._served[type_url]
        state = stream.state(type_url)
        state.sent_digest, state.sent_version = served.digest, served.version
        nonce = self._stamp(state)
        stream.queue.put_nowait(
            discovery_pb2.DiscoveryResponse(
                version_info=served.version, resources=served.packed, type_url=type_url, nonce=nonce
            )
        )
        self.record(
            "send",
            stream.identity,
            type_url,
            served.version,
            nonce,
            tuple(resource_name(r) for r in served.resources),
        )

    def _stamp(self, state: _TypeState) -> str:
        """A new push's nonce, recorded with its time as the push in flight for this type."""
        nonce = str(next(self._nonces))
        state.sent_nonce, state.nack_detail, state.sent_at = nonce, None, time.monotonic()
        return nonce

    def _send_delta(self, stream: _Stream, type_url: str) -> None:
        """Push to a delta stream what differs from what it holds: the resources of its subscription
        whose version it does not have, and the names it holds that are no longer served. Nothing
        differs: nothing is pushed, and the content counts as delivered once the push in flight (if
        any) is acknowledged."""
        served = self._served[type_url]
        state = stream.state(type_url)
        if served.since is not None and state.level_with == served.since:
            # Level with what was served before: only what changed since can differ.
            names = served.changed if state.wildcard else served.changed & state.names
            candidates = sorted(names)
            removed = sorted(n for n in served.removed if n in state.known)
        else:
            candidates = list(served.versions if state.wildcard else served.versions.keys() & state.names)
            removed = sorted(n for n in state.known if n not in served.versions)
        changed = [
            (served.entries[name][1], name)
            for name in candidates
            if state.known.get(name) != served.versions[name]
        ]
        state.level_with = served.serial
        state.sent_digest, state.sent_version = served.digest, served.version
        if not changed and not removed:
            return
        nonce = self._stamp(state)
        for name in removed:
            del state.known[name]
        state.dropped.update(removed)
        response = discovery_pb2.DeltaDiscoveryResponse(
            system_version_info=served.version, type_url=type_url, nonce=nonce, removed_resources=removed
        )
        for any_packed, name in changed:
            state.known[name] = served.versions[name]
            response.resources.add(name=name, version=served.versions[name], resource=any_packed)
        stream.queue.put_nowait(response)
        self.record(
            "send",
            stream.identity,
            type_url,
            served.version,
            nonce,
            tuple(n for _, n in changed),
            detail=f"removed {', '.join(removed)}" if removed else "",
        )

    # ---- progress of pushes ---------------------------------------------------------------------

    def connected(self, identity: str) -> int:
        return sum(1 for s in self._streams.values() if s.identity == identity)

    def progress(self, targets: Mapping[str, str], readers: Iterable[str]) -> Progress:
        """How every stream of every reader stands on each target (type URL → content digest, as
        `serve` returned it): a refusal of one, or what is not yet acknowledged."""
        pending: list[str] = []
        missing: list[str] = []
        for identity in readers:
            streams = [s for s in self._streams.values() if s.identity == identity]
            if not streams:
                missing.append(identity)
                pending.append(f"{identity} (not connected)")
            for stream in streams:
                for type_url, want in targets.items():
                    if type_url not in stream.allowed:
                        continue
                    state = stream.state(type_url)
                    served = self._served[type_url]
                    if not state.subscribed and all(name in served.on_request for name in served.entries):
                        continue  # nothing to hold of a type the client does not ask for (scopes)
                    if state.sent_digest == want and state.nack_detail is not None:
                        return Progress((type_url, state.nack_detail), [], [])
                    if not (state.sent_digest == want and state.acked_nonce == state.sent_nonce) or (
                        stream.delta and not state.wildcard and not self._holds(state, served)
                    ):
                        pending.append(f"{short(type_url)} {served.version} from {identity}")
        return Progress(None, pending, missing)

    @staticmethod
    def _holds(state: _TypeState, served: Served) -> bool:
        """A delta client asking by name (Envoy's route tables, named by its listener or its scopes)
        holds every served resource at its version: it asks for a new table only once it has the scope
        naming it, so an ACK alone does not say the table arrived. A table served for older listeners
        only is held when asked for."""
        return all(
            state.known.get(name) == version
            for name, version in served.versions.items()
            if name not in served.on_request or name in state.names
        )

    def ack_times(self, targets: Iterable[str], readers: Iterable[str], since: float) -> dict[str, float]:
        """Per type pushed after `since` (monotonic), the slowest stream's push-to-ACK time (ms)."""
        out: dict[str, float] = {}
        wanted = set(readers)
        for stream in self._streams.values():
            if stream.identity not in wanted:
                continue
            for type_url in targets:
                state = stream.types.get(type_url)
                if state is not None and state.acked_nonce == state.sent_nonce and state.sent_at >= since:
                    key = f"{short(type_url)}_push_to_ack_ms"
                    out[key] = max(out.get(key, 0.0), round((state.acked_at - state.sent_at) * 1000, 2))
        return out

    async def next_change(self, wait_s: float | None) -> None:
        """Until a stream connects, disconnects, subscribes, ACKs or NACKs (or `wait_s` passes)."""
        event = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), wait_s)

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def event_log(self) -> list[AdsEvent]:
        return list(self.events)

    def record(
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

    # ---- one stream ----------------------------------------------------------------------------

    def close_all(self) -> None:
        for stream in list(self._streams.values()):
            stream.queue.put_nowait(_Close())

    async def run(
        self,
        identity: str,
        request_iterator: AsyncIterator[discovery_pb2.DiscoveryRequest]
        | AsyncIterator[discovery_pb2.DeltaDiscoveryRequest],
        context: grpc.aio.ServicerContext,
        *,
        delta: bool = False,
    ) -> None:
        """Serve one verified client's stream until it ends (`delta`: incremental xDS)."""
        stream = _Stream(next(self._sids), identity, self._allowed[identity], delta=delta)
        self._streams[stream.sid] = stream
        self.record("connect", identity)
        log.info(
            "ads_connected",
            extra={
                "fields": {"identity": identity, "peer": context.peer(), "stream": stream.sid, "delta": delta}
            },
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
            self.record("disconnect", identity)
            log.info("ads_disconnected", extra={"fields": {"identity": identity, "stream": stream.sid}})
            self._notify()

    async def _read(self, stream: _Stream, requests: AsyncIterator[Any]) -> None:
        try:
            async for request in requests:
                if stream.delta:
                    refusal = self._on_delta_request(stream, request)
                else:
                    refusal = self._on_request(stream, request)
                if refusal:
                    stream.queue.put_nowait(_Close(grpc.StatusCode.PERMISSION_DENIED, refusal))
                    return
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            raise
        except Exception:  # a broken client stream must end the stream, never the server
            log.exception("ads_stream_error", extra={"fields": {"identity": stream.identity}})
        stream.queue.put_nowait(_Close())

    def _on_delta_request(self, stream: _Stream, request: discovery_pb2.DeltaDiscoveryRequest) -> str | None:
        """One incremental-xDS request: an ACK or NACK of a push (response_nonce), and subscription
        changes (the first request of a type subscribes, with no names meaning every resource)."""
        type_url = request.type_url
        self._note_node(stream, request.node.id)
        if type_url not in stream.allowed:
            self.record("refuse", stream.identity, type_url, detail="type not allowed for this identity")
            return f"{stream.identity} may not read {type_url}"
        state = stream.state(type_url)
        nonce = request.response_nonce
        latest = bool(nonce) and nonce == state.sent_nonce
        # An older push refused: what it sent is not held, and the pushes since were changes on it.
        stale_refusal = bool(nonce) and not latest and request.HasField("error_detail")
        if stale_refusal:
            self._count_refusal(stream, type_url, request, "")
        if stale_refusal or (latest and not self._take_answer(stream, state, request)):
            # What the client holds is unsure now: the next push sends every resource again, and
            # removes every name it may hold that is no longer served (those the refused pushes
            # removed among them).
            state.known = dict.fromkeys(state.known.keys() | state.dropped, "")
            state.dropped.clear()
            state.level_with = None
        elif latest:
            state.dropped.clear()
        subscribe = set(request.resource_names_subscribe)
        unsubscribe = set(request.resource_names_unsubscribe)
        first = not state.subscribed
        if first:
            state.subscribed = True
            state.wildcard = not subscribe or "*" in subscribe
            state.known = dict(request.initial_resource_versions)
        elif "*" in subscribe:
            state.wildcard = True
        if "*" in unsubscribe:
            state.wildcard = False
        state.names = (state.names | subscribe) - unsubscribe - {"*"}
        for name in unsubscribe:
            state.known.pop(name, None)
        if first or subscribe or unsubscribe:
            state.level_with = None
            self.record(
                "subscribe",
                stream.identity,
                type_url,
                names=tuple(sorted(subscribe)),
                detail="wildcard" if state.wildcard else "",
            )
            if type_url in self._served:
                self._send_delta(stream, type_url)
        elif stale_refusal and type_url in self._served:
            # The push in flight would leave the client short of what it refused: everything again (an
            # ACK of the one in flight no longer counts, its nonce is not the latest).
            self._send_delta(stream, type_url)
        self._notify()
        return None

    def _note_node(self, stream: _Stream, node_id: str) -> None:
        if node_id and not stream.node_id:
            # Logged for operators; never an authentication input.
            stream.node_id = node_id
            log.info("ads_node", extra={"fields": {"identity": stream.identity, "node_id": node_id}})

    def _on_request(self, stream: _Stream, request: discovery_pb2.DiscoveryRequest) -> str | None:
        type_url = request.type_url
        self._note_node(stream, request.node.id)
        if type_url not in stream.allowed:
            self.record("refuse", stream.identity, type_url, detail="type not allowed for this identity")
            return f"{stream.identity} may not read {type_url}"
        state = stream.state(type_url)
        names = frozenset(request.resource_names)
        new_names = bool(names - state.names)
        state.names = names
        if not request.response_nonce:
            state.subscribed = True
            self.record(
                "subscribe", stream.identity, type_url, request.version_info, names=tuple(sorted(names))
            )
            if type_url in self._served:
                self._send(stream, type_url)
            self._notify()
            return None
        if request.response_nonce != state.sent_nonce:
            return None  # about an older push; the answer to the latest one is still to come
        if self._take_answer(stream, state, request) and new_names and type_url in self._served:
            # The client asks for names it did not hold when the last push arrived: resend.
            self._send(stream, type_url)
        self._notify()
        return None

    def _count_refusal(
        self,
        stream: _Stream,
        type_url: str,
        request: discovery_pb2.DiscoveryRequest | discovery_pb2.DeltaDiscoveryRequest,
        version: str,
    ) -> str:
        """Counts and records a client's refusal of a push (`version`: the push's, when known); its detail."""
        detail = request.error_detail.message or f"NACK (code {request.error_detail.code})"
        self.nacks[type_url] += 1
        self.record("nack", stream.identity, type_url, version, request.response_nonce, detail=detail)
        return detail

    def _take_answer(
        self,
        stream: _Stream,
        state: _TypeState,
        request: discovery_pb2.DiscoveryRequest | discovery_pb2.DeltaDiscoveryRequest,
    ) -> bool:
        """Records the client's answer to the latest push (its nonce is the one sent): a NACK, with
        its detail, or an ACK; True for an ACK."""
        type_url = request.type_url
        if request.HasField("error_detail"):
            state.nack_detail = self._count_refusal(stream, type_url, request, state.sent_version or "")
            return False
        state.acked_nonce = request.response_nonce
        state.acked_at = time.monotonic()
        self.record("ack", stream.identity, type_url, state.sent_version or "", request.response_nonce)
        return True
