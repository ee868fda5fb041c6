"""The authorization service's policy set over the Link's ADS: AuthzPolicySet resources (`default`,
the site-wide part, and the route buckets `routes-NNN`), compiled as one set. Every response carries
all of them, so a set is taken whole or not at all: a route in no resource of it is unknown to it.

The subscription itself (ACK/NACK like Envoy, the sets in force kept on a refusal, reconnects with
backoff) is `stoa_ops.policy_sets`, shared with the processing service. Key revocations are read
from every response first, even one refused as a whole: a revocation is never rolled back.
"""

from __future__ import annotations

import contextlib
import threading

import grpc
from envoy.service.discovery.v3.discovery_pb2 import DiscoveryResponse
from google.protobuf.message import DecodeError
from stoa_ops.policy_sets import RESOURCE_NAME, PolicySubscription, Refused, policy_set
from stoa_proto import authz_pb2

from stoa_authz.policy import PolicyError, PolicySet, PolicyStore, compile_policy_set, digest_of

TYPE_URL = "type.googleapis.com/stoa.authz.v1.AuthzPolicySet"

__all__ = ["TYPE_URL", "decode", "revocations", "subscribe"]


class _Unpacked:
    """The resources of a response, decoded once for the revocation reader and the compiler, and
    by their bytes: a response re-sends every bucket, and a resource sent again unchanged is not
    parsed again (only the last response's are held; a response is never edited once received)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._response: DiscoveryResponse | None = None
        self._decoded: list[authz_pb2.AuthzPolicySet | None] = []
        self._by_bytes: dict[bytes, authz_pb2.AuthzPolicySet] = {}

    def __call__(self, response: DiscoveryResponse) -> list[authz_pb2.AuthzPolicySet | None]:
        """Each resource of `response` as an AuthzPolicySet (None: another type, or undecodable).
        The messages may be shared with other responses: nobody mutates them."""
        with self._lock:
            if response is not self._response:
                by_bytes: dict[bytes, authz_pb2.AuthzPolicySet] = {}
                decoded: list[authz_pb2.AuthzPolicySet | None] = []
                for resource in response.resources:
                    message = None
                    if resource.type_url == TYPE_URL:
                        value = resource.value
                        message = self._by_bytes.get(value, by_bytes.get(value))
                        if message is None:
                            with contextlib.suppress(DecodeError):
                                message = authz_pb2.AuthzPolicySet.FromString(value)
                        if message is not None:
                            by_bytes[value] = message
                    decoded.append(message)
                self._response, self._decoded, self._by_bytes = response, decoded, by_bytes
            return self._decoded


_unpacked = _Unpacked()


def decode(response: DiscoveryResponse) -> PolicySet:
    """The policy set of a response, compiled; PolicyError if it cannot be used."""
    if response.type_url != TYPE_URL:
        raise Refused(f"unexpected type {response.type_url!r}")
    resources: list[authz_pb2.AuthzPolicySet] = []
    for resource, decoded in zip(response.resources, _unpacked(response), strict=True):
        if decoded is None:
            raise Refused(f"resource of type {resource.type_url!r} is not an AuthzPolicySet")
        resources.append(decoded)
    # The site resource is the one named `default`, or a lone set left unnamed (as a hand-built one
    # may be): a bucket alone would be taken for a site with no issuers, consumers or subscriptions.
    site = [r for r in resources if r.name == RESOURCE_NAME or (len(resources) == 1 and not r.name)]
    if len(site) != 1:
        raise Refused(f"expected one policy set named {RESOURCE_NAME!r} among {len(resources)} resources")
    (default,) = site
    return compile_policy_set(default, [r for r in resources if r is not default])


def revocations(response: DiscoveryResponse) -> set[bytes]:
    """The revoked key digests in the policy sets of `response`, read even from a set that is
    refused as a whole: a revocation applies whatever happens to the set that carries it."""
    found: set[bytes] = set()
    for message in _unpacked(response):
        for hex_digest in message.revoked_key_sha256 if message is not None else ():
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
