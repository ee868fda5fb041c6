"""ip_filter → `envoy.filters.http.rbac` on the direct peer address (`x-forwarded-for` never counts)."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envoy.config.core.v3 import address_pb2
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from google.protobuf import message, wrappers_pb2

from stoa_translate.filters import RBAC_FILTER
from stoa_translate.policies.kind import ConfigReader, PolicyKind


@dataclass(frozen=True)
class IpFilter:
    policy_id: str
    mode: str  # "allow" | "deny"
    cidrs: tuple[tuple[str, int], ...]  # (network address, prefix length)


def parse(policy_id: str, config: Mapping[str, Any]) -> IpFilter:
    c = ConfigReader(policy_id, config, ("mode", "ip_list"))
    mode = config.get("mode")
    if mode not in ("allow", "deny"):
        raise c.invalid("mode", "must be 'allow' or 'deny'")
    cidrs: list[tuple[str, int]] = []
    for entry in c.strings("ip_list", required=True):
        try:
            # strict=False: host bits in a CIDR are masked, the range matched is the same.
            network = ipaddress.ip_network(entry.strip(), strict=False)
        except ValueError:
            raise c.invalid("ip_list", f"entry {entry!r} is not an IP address or CIDR") from None
        cidrs.append((str(network.network_address), network.prefixlen))
    return IpFilter(policy_id, mode, tuple(sorted(set(cidrs))))


def listener_filter() -> message.Message:
    # No rules at the listener: only a route's own config switches address rules on.
    return rbac_pb2.RBAC()


def route_config(route_id: str, ip_filter: IpFilter) -> rbac_pb2.RBACPerRoute:
    # direct_remote_ip is the peer of the connection: forwarded-address headers never count.
    principals = [
        rbac_config_pb2.Principal(
            direct_remote_ip=address_pb2.CidrRange(
                address_prefix=address, prefix_len=wrappers_pb2.UInt32Value(value=length)
            )
        )
        for address, length in ip_filter.cidrs
    ]
    action = rbac_config_pb2.RBAC.ALLOW if ip_filter.mode == "allow" else rbac_config_pb2.RBAC.DENY
    return rbac_pb2.RBACPerRoute(
        rbac=rbac_pb2.RBAC(
            rules=rbac_config_pb2.RBAC(
                action=action,
                policies={
                    ip_filter.policy_id: rbac_config_pb2.Policy(
                        permissions=[rbac_config_pb2.Permission(any=True)], principals=principals
                    )
                },
            )
        )
    )


KIND = PolicyKind("ip_filter", RBAC_FILTER, parse, listener_filter, route_config)
