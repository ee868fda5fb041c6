"""The authorization service's policy set over the Link's ADS: AuthzPolicySet resources (`default`,
the site-wide part, and the route buckets `routes-NNN`), compiled as one set. The set is taken whole
or not at all (over delta xDS, the one assembled from the resources held and those just sent): a
route in no resource of it is unknown to it.

The subscription itself (delta or state of the world, ACK/NACK like Envoy, what is in force kept on
a refusal, reconnects with backoff) is `stoa_ops.policy_sets`, shared with the processing and MCP
services. Key revocations are read from every set first, even one refused as a whole: a revocation
is never rolled back.
"""

from __future__ import annotations

import contextlib
import threading

import grpc
from google.protobuf.message import DecodeError
from stoa_ops.policy_sets import PolicySubscription, Refused, ResourceSet, policy_set, the_site
from stoa_proto import authz_pb2

from stoa_authz.policy import PolicyError, PolicySet, PolicyStore, compile_policy_set, digest_of

TYPE_URL = "type.googleapis.com/stoa.authz.v1.AuthzPolicySet"

__all__ = ["TYPE_URL", "decode", "revocations", "subscribe"]


class _Unpacked:
    """The resources of a set, decoded once for the revocation reader and the compiler, and by their
    bytes: a set repeats its unchanged buckets, and a resource seen again unchanged is not parsed
    again (only the last set's are held; a set is never edited once received)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._offered: ResourceSet | None = None
        self._decoded: list[authz_pb2.AuthzPolicySet | None] = []
        self._by_bytes: dict[bytes, authz_pb2.AuthzPolicySet] = {}

    def __call__(self, offered: ResourceSet) -> list[authz_pb2.AuthzPolicySet | None]:
        """Each resource of `offered` as an AuthzPolicySet (None: another type, or undecodable).
        The messages may be shared with other sets: nobody mutates them."""
        with self._lock:
            if offered is not self._offered:
                by_bytes: dict[bytes, authz_pb2.AuthzPolicySet] = {}
                decoded: list[authz_pb2.AuthzPolicySet | None] = []
                for resource in offered.resources:
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
                self._offered, self._decoded, self._by_bytes = offered, decoded, by_bytes
            return self._decoded


_unpacked = _Unpacked()


def decode(offered: ResourceSet) -> PolicySet:
    """The policy set of a complete set of resources, compiled; PolicyError if it cannot be used."""
    if offered.type_url != TYPE_URL:
        raise Refused(f"unexpected type {offered.type_url!r}")
    resources: list[authz_pb2.AuthzPolicySet] = []
    for resource, decoded in zip(offered.resources, _unpacked(offered), strict=True):
        if decoded is None:
            raise Refused(f"resource of type {resource.type_url!r} is not an AuthzPolicySet")
        resources.append(decoded)
    default = the_site(resources)
    return compile_policy_set(default, [r for r in resources if r is not default])


def revocations(offered: ResourceSet) -> set[bytes]:
    """The revoked key digests in the policy sets of `offered`, read even from a set that is
    refused as a whole: a revocation applies whatever happens to the set that carries it."""
    found: set[bytes] = set()
    for message in _unpacked(offered):
        for hex_digest in message.revoked_key_sha256 if message is not None else ():
            with contextlib.suppress(PolicyError):
                found.add(digest_of(hex_digest, "revoked key"))
    return found


def subscribe(
    address: str,
    store: PolicyStore,
    credentials: grpc.ChannelCredentials | None = None,
    server_name: str = "",
    delta: bool = True,
) -> PolicySubscription:
    return PolicySubscription(
        address,
        service="stoa-authz",
        resources={TYPE_URL: policy_set(store, decode)},
        credentials=credentials,
        server_name=server_name,
        first=lambda offered: store.revoke(revocations(offered)),
        delta=delta,
    )
