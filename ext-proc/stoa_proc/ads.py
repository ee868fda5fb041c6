"""The ADS client: subscribes to the Link's ProcPolicySet (state of the world) and ACKs/NACKs like
Envoy. A usable set is compiled and stored, then ACKed; an unusable one is NACKed with the reason and
the sets already accepted stay in force. Reconnects with bounded, fully jittered exponential backoff."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable

import grpc
from envoy.config.core.v3.base_pb2 import Node
from envoy.service.discovery.v3 import ads_pb2_grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryRequest, DiscoveryResponse
from google.rpc import code_pb2, status_pb2
from stoa_ops.backoff import Backoff
from stoa_proto import proc_pb2

from stoa_proc.policy import PolicyError, PolicySet, PolicyStore, compile_policy_set

TYPE_URL = "type.googleapis.com/stoa.proc.v1.ProcPolicySet"
RESOURCE_NAME = "default"

log = logging.getLogger("stoa_proc.ads")


def channel_credentials(ca: bytes, cert: bytes, key: bytes) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def decode(response: DiscoveryResponse, default_max_body_bytes: int) -> PolicySet:
    """The policy set of a response, compiled; PolicyError if it cannot be used."""
    if response.type_url != TYPE_URL:
        raise PolicyError(f"unexpected type {response.type_url!r}")
    sets: list[proc_pb2.ProcPolicySet] = []
    for resource in response.resources:
        message = proc_pb2.ProcPolicySet()
        if resource.type_url != TYPE_URL or not resource.Unpack(message):
            raise PolicyError(f"resource of type {resource.type_url!r} is not a ProcPolicySet")
        sets.append(message)
    named = [s for s in sets if s.name == RESOURCE_NAME] or sets
    if len(named) != 1:
        raise PolicyError(f"expected one policy set named {RESOURCE_NAME!r}, got {len(sets)} resources")
    return compile_policy_set(named[0], default_max_body_bytes)


class PolicySubscription:
    def __init__(
        self,
        address: str,
        store: PolicyStore,
        default_max_body_bytes: int,
        credentials: grpc.ChannelCredentials | None = None,
        server_name: str = "",
        on_change: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._address = address
        self._store = store
        self._default_max_body_bytes = default_max_body_bytes
        self._credentials = credentials
        self._server_name = server_name
        self._on_change = on_change
        self._node = Node(id=f"stoa-proc/{socket.gethostname()}/{os.getpid()}", cluster="stoa-proc")
        self.accepted_version_info = ""

    def _channel(self) -> grpc.aio.Channel:
        options = [("grpc.max_receive_message_length", 64 * 1024 * 1024)]
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
                log.warning("ads_stream_ended", extra={"code": exc.code().name, "detail": exc.details()})
            except Exception:
                log.exception("ads_stream_failed")
            await asyncio.sleep(backoff.next_delay())

    async def _stream(self) -> bool:
        """One stream; True when at least one response was handled (the connection worked)."""
        handled = False
        async with self._channel() as channel:
            call = ads_pb2_grpc.AggregatedDiscoveryServiceStub(channel).StreamAggregatedResources()
            await call.write(self._request(self.accepted_version_info))
            while True:
                response = await call.read()
                if response is grpc.aio.EOF:
                    return handled
                handled = True
                await call.write(await self._apply(response))

    async def _apply(self, response: DiscoveryResponse) -> DiscoveryRequest:
        try:
            policy_set = decode(response, self._default_max_body_bytes)
        except Exception as exc:
            # Anything compile did not foresee is a refusal too: NACK, the sets in force stay.
            if not isinstance(exc, PolicyError):
                log.exception("policy_set_uncompilable")
                exc = PolicyError(f"policy set could not be compiled: {type(exc).__name__}")
            log.warning(
                "policy_set_refused", extra={"version_info": response.version_info, "error": str(exc)}
            )
            return self._request(
                self.accepted_version_info,
                response.nonce,
                status_pb2.Status(code=code_pb2.INVALID_ARGUMENT, message=str(exc)),
            )
        self._store.add(policy_set)
        if self._on_change is not None:
            await self._on_change()
        self.accepted_version_info = response.version_info
        log.info(
            "policy_set_accepted",
            extra={"policy_set_version": policy_set.version, "routes": len(policy_set.routes)},
        )
        return self._request(response.version_info, response.nonce)

    def _request(
        self, version_info: str, nonce: str = "", error: status_pb2.Status | None = None
    ) -> DiscoveryRequest:
        return DiscoveryRequest(
            node=self._node,
            type_url=TYPE_URL,
            resource_names=[RESOURCE_NAME],
            version_info=version_info,
            response_nonce=nonce,
            error_detail=error,
        )
