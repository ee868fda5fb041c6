"""The site settings that shape a translation: the Link's own; the CP previews with those a Link reported."""

from __future__ import annotations

import dataclasses
import ipaddress
from dataclasses import dataclass

from stoa_ops.address import split_host_port
from stoa_proto import client_headers, inventory_pb2

PLACEMENTS = ("auto", "service")


@dataclass(frozen=True)
class TranslateOptions:
    listener_address: str = "127.0.0.1"
    listener_port: int = 10000
    # host:port of the authorization service's gRPC endpoint.
    ext_authz_address: str = "127.0.0.1:9191"
    ext_authz_timeout_ms: int = 250
    # host:port of the processing service's gRPC endpoint (used when a route has a body policy).
    ext_proc_address: str = "127.0.0.1:9291"
    # host:port of the site's MCP module (streamable HTTP), where the MCP routes go.
    mcp_address: str = "127.0.0.1:9391"
    default_route_timeout_ms: int = 15000
    xff_num_trusted_hops: int = 0
    # Identity header names (or prefixes ending in "*") this site's upstreams trust, removed on top of
    # `stoa_proto.client_headers`; lower-case, validated by `client_headers.extra_names`.
    extra_identity_headers: tuple[str, ...] = ()
    # "auto": each route decided by Envoy's built-in filters where they can; "service": every route
    # through the authorization service.
    decision_placement: str = "auto"
    # What the authorization service is configured with, for the decisions Envoy makes: the audience
    # every token must name (without it, no route is decided by Envoy), the scopes every token must
    # hold, the claim naming the tenant, the longest token lifetime honoured.
    audience: str = ""
    required_scopes: tuple[str, ...] = ()
    tenant_claim: str = "tenant_id"
    max_token_lifetime_s: int = 86_400
    # The bootstrap cluster Envoy sends its native denials' access log on (the Link's ADS server);
    # empty: not sent.
    decision_log_cluster: str = ""
    # Scoped RDS (`stoa_translate.routes`): a scope per API key, the route entries in bucketed route
    # tables, so a change re-sends one small table. For an Envoy on delta xDS (the Link sets it with
    # STOA_LINK_XDS=delta); off: the one route table `stoa-routes`.
    route_scopes: bool = False

    def __post_init__(self) -> None:
        try:
            ipaddress.ip_address(self.listener_address)
        except ValueError:
            raise ValueError(f"listener_address {self.listener_address!r} is not an IP address") from None
        if not 0 < self.listener_port < 65536:
            raise ValueError(f"listener_port {self.listener_port} is not a TCP port")
        self.ext_authz_endpoint()
        self.ext_proc_endpoint()
        self.mcp_endpoint()
        if not 0 < self.ext_authz_timeout_ms <= 60_000:
            raise ValueError(f"ext_authz_timeout_ms {self.ext_authz_timeout_ms} is not in 1..60000")
        if self.default_route_timeout_ms <= 0:
            raise ValueError(f"default_route_timeout_ms {self.default_route_timeout_ms} must be positive")
        if client_headers.extra_names(",".join(self.extra_identity_headers)) != self.extra_identity_headers:
            names = self.extra_identity_headers
            raise ValueError(f"extra_identity_headers {names!r}: not lower-case, or repeated")
        if self.decision_placement not in PLACEMENTS:
            raise ValueError(
                f"decision_placement {self.decision_placement!r} is not one of {', '.join(PLACEMENTS)}"
            )
        if any(not scope.strip() or " " in scope for scope in self.required_scopes):
            raise ValueError("required_scopes holds a blank scope or one with a space")
        if self.max_token_lifetime_s < 60:
            raise ValueError(f"max_token_lifetime_s {self.max_token_lifetime_s} is below 60")
        if self.xff_num_trusted_hops < 0:
            raise ValueError(f"xff_num_trusted_hops {self.xff_num_trusted_hops} must not be negative")

    def ext_authz_endpoint(self) -> tuple[str, int]:
        """(host, port) of ext_authz_address; an IPv6 host may be bracketed."""
        return _endpoint("ext_authz_address", self.ext_authz_address)

    def ext_proc_endpoint(self) -> tuple[str, int]:
        return _endpoint("ext_proc_address", self.ext_proc_address)

    def mcp_endpoint(self) -> tuple[str, int]:
        return _endpoint("mcp_address", self.mcp_address)

    def to_settings(self) -> inventory_pb2.TranslateSettings:
        """These options as the Link reports them to the CP (field for field)."""
        return inventory_pb2.TranslateSettings(
            **{f.name: getattr(self, f.name) for f in dataclasses.fields(self)}  # type: ignore[arg-type]
        )

    @classmethod
    def from_settings(cls, settings: inventory_pb2.TranslateSettings) -> TranslateOptions:
        """The options a Link reported; a field it did not report (an older Link) keeps its default."""
        present = {f.name for f, _ in settings.ListFields()}
        values: dict[str, object] = {}
        for field in dataclasses.fields(cls):
            if field.name in present:
                value = getattr(settings, field.name)
                values[field.name] = value if isinstance(value, str | int) else tuple(value)
        return cls(**values)  # type: ignore[arg-type]


def _endpoint(name: str, address: str) -> tuple[str, int]:
    host, port = split_host_port(address, name, "127.0.0.1:9191")
    if port == 0:
        raise ValueError(f"{name} {address!r} is not host:port (port 0)")
    return host, port
