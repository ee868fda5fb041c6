"""ip_filter → `envoy.filters.http.rbac` on the direct peer address (`x-forwarded-for` never counts)."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from envoy.config.core.v3 import address_pb2
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from google.protobuf import message, wrappers_pb2
from stoa_proto import inventory_pb2

from stoa_translate.filters import RBAC_FILTER
from stoa_translate.policies.kind import ConfigError, PolicyKind


@dataclass(frozen=True)
class IpFilter:
    policy_id: str
    mode: str  # "allow" | "deny"
    entries: tuple[str, ...]  # canonical addresses and CIDRs, first occurrence kept

    @property
    def cidrs(self) -> tuple[tuple[str, int], ...]:
        """(network address, prefix length) of each entry, sorted and unique."""
        networks = {ipaddress.ip_network(entry) for entry in self.entries}
        return tuple(sorted({(str(n.network_address), n.prefixlen) for n in networks}))


def parse(policy_id: str, config: inventory_pb2.IpFilterPolicy) -> IpFilter:
    if config.mode not in ("allow", "deny"):
        raise ConfigError("mode", "must be 'allow' or 'deny'")
    if not config.ip_list:
        raise ConfigError("ip_list", "must hold at least one address or CIDR")
    networks = []
    for i, entry in enumerate(config.ip_list):
        try:
            # strict: a CIDR with host bits set (10.0.0.1/8) is refused rather than silently widened.
            networks.append(ipaddress.ip_network(entry, strict=True))
        except ValueError as exc:
            raise ConfigError(
                f"ip_list[{i}]", f"must be a CIDR or a single IPv4/IPv6 address ({exc})"
            ) from None
    return IpFilter(
        policy_id,
        config.mode,
        tuple(dict.fromkeys(_text(network) for network in networks)),
    )


def _text(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> str:
    """A single address as an address, a range as a CIDR, both in canonical text."""
    single = network.prefixlen == network.max_prefixlen
    return str(network.network_address) if single else str(network)


def normalised(ip_filter: IpFilter) -> inventory_pb2.IpFilterPolicy:
    return inventory_pb2.IpFilterPolicy(mode=ip_filter.mode, ip_list=ip_filter.entries)


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


KIND = PolicyKind(
    "ip_filter",
    RBAC_FILTER,
    inventory_pb2.IpFilterPolicy,
    parse,
    normalised,
    listener_filter,
    route_config,
    list_limits={"ip_list": "addresses"},
)
