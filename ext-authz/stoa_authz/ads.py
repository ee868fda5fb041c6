"""The authorization service's policy set over the Link's ADS: an AuthzPolicySet, compiled.

The subscription itself (ACK/NACK like Envoy, the sets in force kept on a refusal, reconnects with
backoff) is `stoa_ops.policy_sets`, shared with the processing service. Key revocations are read
from every response first, even one refused as a whole: a revocation is never rolled back.
"""

from __future__ import annotations

import contextlib

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from google.protobuf.message import DecodeError
from stoa_ops.policy_sets import PolicySubscription, policy_set, the_resource
from stoa_proto import authz_pb2

from stoa_authz.policy import PolicyError, PolicySet, PolicyStore, compile_policy_set, digest_of

TYPE_URL = "type.googleapis.com/stoa.authz.v1.AuthzPolicySet"

__all__ = ["TYPE_URL", "decode", "revocations", "subscribe"]


def decode(response: DiscoveryResponse) -> PolicySet:
    """The policy set of a response, compiled; PolicyError if it cannot be used."""
    return compile_policy_set(the_resource(response, TYPE_URL, authz_pb2.AuthzPolicySet))


def revocations(response: DiscoveryResponse) -> set[bytes]:
    """The revoked key digests in the policy sets of `response`, read even from a set that is
    refused as a whole: a revocation applies whatever happens to the set that carries it."""
    found: set[bytes] = set()
    for resource in response.resources:
        message = authz_pb2.AuthzPolicySet()
        try:
            if resource.type_url != TYPE_URL or not resource.Unpack(message):
                continue
        except DecodeError:
            continue
        for hex_digest in message.revoked_key_sha256:
            with contextlib.suppress(PolicyError):
                found.add(digest_of(hex_digest, "revoked key"))
    return found


def subscribe(
    address: str,
    store: PolicyStore,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str = "",
) -> PolicySubscription:
    return PolicySubscription(
        address,
        service="stoa-authz",
        resources={TYPE_URL: policy_set(store, decode)},
        credentials=credentials,
        server_name=server_name,
        first=lambda response: store.revoke(revocations(response)),
    )
