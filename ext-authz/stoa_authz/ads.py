"""The authorization service's policy set over the Link's ADS: an AuthzPolicySet, compiled.

The subscription itself (ACK/NACK like Envoy, the sets in force kept on a refusal, reconnects with
backoff) is `stoa_ops.policy_sets`, shared with the processing service.
"""

from __future__ import annotations

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from stoa_ops.policy_sets import PolicySubscription, the_resource
from stoa_proto import authz_pb2

from stoa_authz.policy import PolicySet, PolicyStore, compile_policy_set

TYPE_URL = "type.googleapis.com/stoa.authz.v1.AuthzPolicySet"

__all__ = ["TYPE_URL", "decode", "subscribe"]


def decode(response: DiscoveryResponse) -> PolicySet:
    """The policy set of a response, compiled; PolicyError if it cannot be used."""
    return compile_policy_set(the_resource(response, TYPE_URL, authz_pb2.AuthzPolicySet))


def subscribe(
    address: str,
    store: PolicyStore,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str = "",
) -> PolicySubscription[PolicySet]:
    return PolicySubscription(
        address,
        store,
        service="stoa-authz",
        type_url=TYPE_URL,
        decode=decode,
        credentials=credentials,
        server_name=server_name,
    )
