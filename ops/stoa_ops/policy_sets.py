"""A site service's policy set, as the Link serves it over ADS: subscribed to, compiled, ACKed or
NACKed like Envoy, and the last few accepted sets kept by version.

Incremental (delta) xDS by default: a response carries only the resources that changed and the names
removed, and the service keeps what it holds by name and assembles the complete set from it, so every
rule that takes a set whole still reads it whole. State of the world on request (each response is the
complete set). A usable set is compiled and stored, then ACKed; an unusable one is NACKed with the
reason, and the sets already accepted (and, in delta, the resources held) stay as they were. Reconnects
with bounded, fully jittered exponential backoff, naming what is held. The authorization, processing
and MCP services each bring their own resource types and compilers.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence, Sized
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

import grpc
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import (
    DeltaDiscoveryRequest,
    DeltaDiscoveryResponse,
    DiscoveryRequest,
    DiscoveryResponse,
    Resource,
)
from google.protobuf import any_pb2, message
from google.rpc import code_pb2, status_pb2

from stoa_ops.backoff import Backoff

RESOURCE_NAME = "default"
# Policy sets of thousands of routes are larger than grpc's default 4 MiB message limit.
MAX_RECEIVE_BYTES = 64 * 1024 * 1024


class Refused(Exception):
    """A policy set the service cannot use (NACKed with this message); each service's PolicyError."""


class Versioned(Protocol):
    """A compiled policy set: its version, and its routes (counted in the logs)."""

    @property
    def version(self) -> str: ...

    @property
    def routes(self) -> Sized: ...


class Named(Protocol):
    """A policy set resource: named (`default` for the site's own)."""

    @property
    def name(self) -> str: ...


V = TypeVar("V", bound=Versioned)
M = TypeVar("M", bound=message.Message)
N = TypeVar("N", bound=Named)


@dataclass(frozen=True)
class ResourceSet:
    """A type's complete set of resources, in name order: one state-of-the-world response, or what the
    delta responses so far assembled (`assembled`). What every handler reads: a set is taken whole."""

    type_url: str
    version_info: str
    resources: Sequence[any_pb2.Any]

    @classmethod
    def of(cls, response: DiscoveryResponse) -> ResourceSet:
        return cls(response.type_url, response.version_info, tuple(response.resources))


def assembled(
    held: Mapping[str, Resource], response: DeltaDiscoveryResponse
) -> tuple[dict[str, Resource], ResourceSet]:
    """What a delta client holds once it takes `response` (its resources added or replacing those of the
    same name, its removed names dropped), and that complete set. `held` is left as it was: a refused
    response changes nothing. A resource sent without content stays in the set as an empty Any, which
    no handler decodes: it is refused with the set, and the others are still read (revocations)."""
    resources = dict(held)
    for name in response.removed_resources:
        resources.pop(name, None)
    for resource in response.resources:
        resources[resource.name] = resource
    complete = tuple(resources[name].resource for name in sorted(resources))
    return resources, ResourceSet(response.type_url, response.system_version_info, complete)


class KeptVersions(Generic[V]):
    """The last few accepted policy sets, by version; a request asks for the version its route names."""

    def __init__(self, keep: int = 4, on_change: Callable[[], None] | None = None) -> None:
        self._keep = keep
        self._sets: OrderedDict[str, V] = OrderedDict()
        self.on_change = on_change

    def add(self, policy_set: V) -> None:
        # Same content, same version: keep the loaded object (and whatever it has warmed). The map is
        # replaced, never mutated: requests on other threads read it without a lock.
        sets = OrderedDict(self._sets)
        current = sets.pop(policy_set.version, None)
        sets[policy_set.version] = current or policy_set
        while len(sets) > self._keep:
            sets.popitem(last=False)
        self._sets = sets
        if self.on_change:
            self.on_change()

    def get(self, version: str) -> V | None:
        return self._sets.get(version)

    def versions(self) -> list[str]:
        return list(self._sets)

    def __bool__(self) -> bool:
        return bool(self._sets)


def channel_credentials(ca: bytes, cert: bytes, key: bytes) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def the_site(resources: Sequence[N]) -> N:
    """The site's own resource among a type's: the one named `default` (every producer names it so).
    Strict: a set under another name, or unnamed, is refused even alone, so a route bucket alone is
    never taken for a site with no issuers, consumers or subscriptions."""
    site = [r for r in resources if r.name == RESOURCE_NAME]
    if len(site) != 1:
        raise Refused(f"expected one policy set named {RESOURCE_NAME!r} among {len(resources)} resources")
    return site[0]


def the_resource(offered: ResourceSet, type_url: str, kind: type[M]) -> M:
    """The one resource of a type served as a single resource (`the_site` of it, and nothing beside
    it: a resource the service would not read is refused rather than ignored); Refused otherwise."""
    if offered.type_url != type_url:
        raise Refused(f"unexpected type {offered.type_url!r}")
    sets: list[M] = []
    for resource in offered.resources:
        decoded = kind()
        if resource.type_url != type_url or not resource.Unpack(decoded):
            raise Refused(f"resource of type {resource.type_url!r} is not a {kind.DESCRIPTOR.name}")
        sets.append(decoded)
    site = the_site(sets)  # type: ignore[type-var]  # every policy set message has a name
    if len(sets) != 1:
        raise Refused(f"expected one policy set named {RESOURCE_NAME!r}, got {len(sets)} resources")
    return site


# A resource type's handler: uses a complete set (raising Refused, or anything it did not foresee:
# both NACK it, what is in force stays) and returns the fields its acceptance is logged with.
Apply = Callable[[ResourceSet], Awaitable[Mapping[str, object]]]


def policy_set(
    store: KeptVersions[V],
    decode: Callable[[ResourceSet], V],
    on_change: Callable[[], Awaitable[None]] | None = None,
) -> Apply:
    """The handler of a compiled policy set: `decode` it, keep it in `store`, then `on_change`."""

    async def apply(offered: ResourceSet) -> Mapping[str, object]:
        compiled = decode(offered)
        store.add(compiled)
        if on_change is not None:
            await on_change()
        return {"policy_set_version": compiled.version, "routes": len(compiled.routes)}

    return apply


class PolicySubscription:
    """One ADS stream from `service` (its node id and cluster) to `address`, subscribed to every
    resource of each type URL of `resources` and answering each response like Envoy: ACK once its
    handler used the complete set, NACK (with the reason; what is in force named) when it refused it.
    `delta`: incremental xDS (DeltaAggregatedResources; state of the world once a server answers it
    UNIMPLEMENTED), else state of the world."""

    def __init__(
        self,
        address: str,
        *,
        service: str,
        resources: Mapping[str, Apply],
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str = "",
        first: Callable[[ResourceSet], None] | None = None,
        delta: bool = True,
    ) -> None:
        self._address = address
        self._resources = dict(resources)
        # Read from every complete set before its handler, whether it is then accepted or refused
        # (what must apply even from a refused set: the authorization service's key revocations).
        self._first = first
        self._credentials = credentials
        self._server_name = server_name
        self._delta = delta
        self._node = Node(id=f"{service}/{socket.gethostname()}/{os.getpid()}", cluster=service)
        self._log = logging.getLogger(f"{service.replace('-', '_')}.ads")
        # The version accepted last, by type URL (what a NACK or a resubscription names).
        self.accepted: dict[str, str] = dict.fromkeys(self._resources, "")
        # Delta: the resources of the set accepted last, by type URL and name (kept across streams).
        self.held: dict[str, dict[str, Resource]] = {t: {} for t in self._resources}

    @property
    def accepted_version_info(self) -> str:
        """The version accepted last, for a subscription to a single type."""
        (version,) = self.accepted.values()
        return version

    def _channel(self) -> grpc.aio.Channel:
        options: list[tuple[str, int | str]] = [("grpc.max_receive_message_length", MAX_RECEIVE_BYTES)]
        if self._credentials is None:
            return grpc.aio.insecure_channel(self._address, options=options)
        if self._server_name:
            options.append(("grpc.ssl_target_name_override", self._server_name))
        return grpc.aio.secure_channel(self._address, self._credentials, options=options)

    async def run(self) -> None:
        """Forever: connect, subscribe, apply; back off with jitter between attempts."""
        backoff = Backoff()
        while True:
            try:
                if await self._stream():
                    backoff.reset()
            except asyncio.CancelledError:
                raise
            except grpc.aio.AioRpcError as exc:
                self._log.warning(
                    "ads_stream_ended", extra={"code": exc.code().name, "detail": exc.details()}
                )
                if self._delta and exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                    # A Link from before delta xDS for the site services: state of the world from now on
                    # (each response then carries the complete set; what is in force stays).
                    self._log.warning("ads_delta_unimplemented_using_state_of_the_world")
                    self._delta = False
            except Exception:
                self._log.exception("ads_stream_failed")
            await asyncio.sleep(backoff.next_delay())

    async def _stream(self) -> bool:
        """One stream; True when at least one response was handled (the connection worked)."""
        handled = False
        async with self._channel() as channel:
            stub = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            # Subscribe naming what we hold, so the server can skip re-sending what is unchanged.
            if self._delta:
                call = stub.DeltaAggregatedResources()
                for type_url, held in self.held.items():
                    versions = {name: resource.version for name, resource in held.items()}
                    await call.write(
                        DeltaDiscoveryRequest(
                            node=self._node, type_url=type_url, initial_resource_versions=versions
                        )
                    )
            else:
                call = stub.StreamAggregatedResources()
                for type_url, version in self.accepted.items():
                    await call.write(self._request(type_url, version))
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return handled
                handled = True
                if self._delta:
                    await call.write(await self.apply_delta(response))
                else:
                    await call.write(await self.apply(response))

    async def apply(self, response: DiscoveryResponse) -> DiscoveryRequest:
        """The ACK or NACK of a state-of-the-world `response`."""
        refusal = await self._take(ResourceSet.of(response), time.perf_counter())
        if refusal is not None:
            return self._request(
                response.type_url, self.accepted.get(response.type_url, ""), response.nonce, refusal
            )
        return self._request(response.type_url, response.version_info, response.nonce)

    async def apply_delta(self, response: DeltaDiscoveryResponse) -> DeltaDiscoveryRequest:
        """The ACK or NACK of a delta `response`: the resources held once it is taken, assembled into
        the complete set; they become what is held only when that set is accepted."""
        started = time.perf_counter()
        held = self.held.get(response.type_url, {})
        resources, offered = assembled(held, response)
        refusal = await self._take(offered, started)
        if refusal is None and response.type_url in self.held:
            self.held[response.type_url] = resources
        return DeltaDiscoveryRequest(
            node=self._node, type_url=response.type_url, response_nonce=response.nonce, error_detail=refusal
        )

    async def _take(self, offered: ResourceSet, started: float) -> status_pb2.Status | None:
        """Hand the complete set to its type's handler; None once it is in force, else the NACK's
        error (what is in force stays)."""
        if self._first is not None:
            self._first(offered)
        type_url = offered.type_url
        handler = self._resources.get(type_url)
        try:
            if handler is None:
                raise Refused(f"unexpected type {type_url!r}")
            fields = await handler(offered)
        except Exception as exc:
            # Anything the handler did not foresee is a refusal too: NACK (what is in force stays)
            # rather than drop the stream and be sent the same resource again after every reconnect.
            if not isinstance(exc, Refused):
                self._log.exception("policy_set_uncompilable")
                exc = Refused(f"policy set could not be compiled: {type(exc).__name__}")
            self._log.warning(
                "policy_set_refused",
                extra={"type": _short(type_url), "version_info": offered.version_info, "error": str(exc)},
            )
            return status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=str(exc))
        self.accepted[type_url] = offered.version_info
        # From the response read to its ACK (the rest of a publication's wait is the transport).
        fields = {**fields, "apply_ms": round((time.perf_counter() - started) * 1000, 2)}
        self._log.info("policy_set_accepted", extra={"type": _short(type_url), **fields})
        return None

    def _request(
        self, type_url: str, version_info: str, nonce: str = "", error: status_pb2.Status | None = None
    ) -> DiscoveryRequest:
        """A state-of-the-world request for every resource of the type (a set may be several: the
        authorization set is `default` and its route buckets) naming the version held; an ACK or NACK
        adds the nonce it answers, a NACK its error."""
        return DiscoveryRequest(
            node=self._node,
            type_url=type_url,
            resource_names=[],
            version_info=version_info,
            response_nonce=nonce,
            error_detail=error,
        )


def _short(type_url: str) -> str:
    return type_url.rsplit(".", 1)[-1]
