"""The processing service's policy set over the Link's ADS: a ProcPolicySet, compiled with the
service's body limit.

The subscription itself (delta or state of the world, ACK/NACK like Envoy, the sets in force kept on
a refusal, reconnects with backoff) is `stoa_ops.policy_sets`, shared with the authorization and MCP
services.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import grpc
from stoa_ops.policy_sets import PolicySubscription, ResourceSet, policy_set, the_resource
from stoa_proto import proc_pb2

from stoa_proc.policy import PolicySet, PolicyStore, compile_policy_set

TYPE_URL = "type.googleapis.com/stoa.proc.v1.ProcPolicySet"

__all__ = ["TYPE_URL", "decode", "subscribe"]


def decode(offered: ResourceSet, default_max_body_bytes: int) -> PolicySet:
    """The policy set of a complete set of resources, compiled; PolicyError if it cannot be used."""
    return compile_policy_set(the_resource(offered, TYPE_URL, proc_pb2.ProcPolicySet), default_max_body_bytes)


def subscribe(
    address: str,
    store: PolicyStore,
    default_max_body_bytes: int,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str = "",
    on_change: Callable[[], Awaitable[None]] | None = None,
    delta: bool = True,
) -> PolicySubscription:
    return PolicySubscription(
        address,
        service="stoa-proc",
        resources={TYPE_URL: policy_set(store, lambda r: decode(r, default_max_body_bytes), on_change)},
        credentials=credentials,
        server_name=server_name,
        delta=delta,
    )
