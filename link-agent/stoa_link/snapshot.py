"""A snapshot: everything the Link serves over ADS for one inventory generation.

The translator produces it (pure), the ADS server serves it. Its version is a hash of the
deterministic serialisation of its content, so the same content always has the same version.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from google.protobuf.message import Message

CLUSTER = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
LISTENER = "type.googleapis.com/envoy.config.listener.v3.Listener"
ROUTE = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
AUTHZ_POLICY_SET = "type.googleapis.com/stoa.authz.v1.AuthzPolicySet"

# Envoy's own types, in the order a state-of-the-world publication must follow.
ENVOY_TYPES: tuple[str, ...] = (CLUSTER, LISTENER, ROUTE)
# Types served to the site services; published (and acknowledged) before Envoy's.
SITE_SERVICE_TYPES: tuple[str, ...] = (AUTHZ_POLICY_SET,)


def resource_name(resource: Message) -> str:
    return str(resource.name)  # type: ignore[attr-defined]


def content_version(resources: Mapping[str, Iterable[Message]]) -> str:
    """Hash of the deterministic serialisation of every resource, by type then by name."""
    digest = hashlib.sha256()
    for type_url in sorted(resources):
        digest.update(type_url.encode())
        for res in sorted(resources[type_url], key=resource_name):
            body = res.SerializeToString(deterministic=True)
            digest.update(len(body).to_bytes(8, "big"))
            digest.update(body)
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class Snapshot:
    """Resources by type URL, each tuple sorted by resource name."""

    gateway_id: str
    generation: int
    resources: Mapping[str, tuple[Message, ...]]
    version: str = field(default="")

    @classmethod
    def build(cls, gateway_id: str, generation: int, resources: Mapping[str, Iterable[Message]]) -> Snapshot:
        ordered = {t: tuple(sorted(rs, key=resource_name)) for t, rs in resources.items()}
        return cls(gateway_id, generation, ordered, content_version(ordered))

    def of(self, type_url: str) -> tuple[Message, ...]:
        return self.resources.get(type_url, ())

    def names(self, type_url: str) -> list[str]:
        return [resource_name(r) for r in self.of(type_url)]
