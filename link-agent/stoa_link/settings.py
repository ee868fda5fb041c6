"""The Link's settings (`STOA_LINK_*` environment variables), validated at start."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import SettingsConfigDict
from stoa_ops.address import ip_host_port, is_loopback
from stoa_ops.site_settings import DecisionSettings
from stoa_proto import client_headers


def loopback_endpoint(address: str) -> tuple[str, int]:
    """Split an ADS `host:port` and insist on a loopback IP literal.

    The ADS server hands out the whole site's configuration; it must never be reachable from
    another machine, so anything but 127.0.0.0/8 or ::1 is refused.
    """
    host, port = ip_host_port(
        address, "ADS address", "127.0.0.1:18000", "a loopback IP literal (127.0.0.1 or ::1)"
    )
    if not is_loopback(host):
        raise ValueError(
            f"ADS address {address!r} is not a loopback address: the ADS server binds to 127.0.0.0/8 "
            "or ::1 only"
        )
    return host, port


class LinkSettings(DecisionSettings):
    model_config = SettingsConfigDict(env_prefix="STOA_LINK_", extra="ignore")

    cp_url: str = ""
    gateway_id: str = ""
    gateway_credential: SecretStr = SecretStr("")
    ads_address: str = "127.0.0.1:18000"
    tls_dir: Path = Path(".stoa/tls")
    envoy_san: str = "spiffe://stoa.local/envoy"
    # Empty: no authorization-service client is expected (a Check witness stands in).
    authz_san: str = "spiffe://stoa.local/ext-authz"
    # The processing service's URI SAN; empty: no processing-service client is expected (a route with
    # a body policy then answers 503, as with the service down).
    proc_san: str = ""
    # The MCP module's URI SAN; empty: no MCP module client is expected (MCP routes then answer 503).
    mcp_san: str = ""
    listener_address: str = "127.0.0.1"
    listener_port: int = Field(default=10000, ge=1, le=65535)
    ext_authz_address: str = "127.0.0.1:9191"
    ext_authz_timeout_ms: int = Field(default=250, ge=1)
    ext_proc_address: str = "127.0.0.1:9291"
    # The site's MCP module (streamable HTTP), where the MCP routes go.
    mcp_address: str = "127.0.0.1:9391"
    ack_timeout_s: float = Field(default=10.0, gt=0)
    # The xDS variant the bootstrap asks Envoy to use: "sotw" (state of the world) or "delta"
    # (incremental: only changed resources travel). The ADS server speaks both whatever this says.
    xds: Literal["sotw", "delta"] = "sotw"
    # Follow the CP's event stream as deltas (what changed, checked against the complete inventory's
    # hash); false: every event carries the complete inventory (a CP without deltas, or to compare).
    deltas: bool = True
    state_dir: Path = Path(".stoa/link-state")
    envoy_admin_port: int = Field(default=9901, ge=1, le=65535)
    env: Literal["development", "production"] = "development"
    # Operator endpoint (/health/live, /health/ready, /metrics); empty disables it.
    http_address: str = "127.0.0.1:9902"
    # Comma-separated identity header names this site's upstreams trust ("x-corp-*" for a prefix),
    # stripped from clients on top of stoa_proto.client_headers (whose defaults cannot be removed).
    extra_identity_headers: str = ""
    # Where route decisions run: "auto" (Envoy's built-in filters where they decide exactly what the
    # authorization service would) or "service" (every route through the service).
    decision_placement: Literal["auto", "service"] = "auto"
    # audience, required_scopes, tenant_claim, max_token_lifetime_s: the authorization service's own
    # decision settings (DecisionSettings), which Envoy needs to decide as it does (the same values as
    # STOA_AUTHZ_AUDIENCE, _REQUIRED_SCOPES, _TENANT_CLAIM, _MAX_TOKEN_LIFETIME_S).

    @field_validator("ads_address")
    @classmethod
    def _loopback_only(cls, value: str) -> str:
        loopback_endpoint(value)
        return value

    @field_validator("http_address")
    @classmethod
    def _http_endpoint(cls, value: str) -> str:
        if value:
            ip_host_port(value, "HTTP address", "127.0.0.1:9902")
        return value

    @field_validator("envoy_san", "authz_san", "proc_san", "mcp_san")
    @classmethod
    def _uri_san(cls, value: str) -> str:
        if value and "://" not in value:
            raise ValueError(f"{value!r} is not a URI (for example spiffe://stoa.local/envoy)")
        return value

    @field_validator("cp_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError(f"{value!r} is not an http(s) URL")
        return value.rstrip("/")

    @field_validator("extra_identity_headers")
    @classmethod
    def _header_names(cls, value: str) -> str:
        client_headers.extra_names(value)
        return value

    @property
    def identity_headers_added(self) -> tuple[str, ...]:
        return client_headers.extra_names(self.extra_identity_headers)

    @property
    def ads_endpoint(self) -> tuple[str, int]:
        return loopback_endpoint(self.ads_address)

    @property
    def http_endpoint(self) -> tuple[str, int] | None:
        """Where the operator endpoint listens, or None when disabled."""
        if not self.http_address:
            return None
        return ip_host_port(self.http_address, "HTTP address", "127.0.0.1:9902")

    def require_run_settings(self) -> None:
        """`run` needs to reach the CP as its gateway; `bootstrap` and `certs` do not."""
        missing = [
            f"STOA_LINK_{name.upper()}"
            for name, value in (
                ("cp_url", self.cp_url),
                ("gateway_id", self.gateway_id),
                ("gateway_credential", self.gateway_credential.get_secret_value()),
            )
            if not value
        ]
        if missing:
            raise ValueError(f"missing settings: {', '.join(missing)}")
        if self.blank_scope:
            raise ValueError("STOA_LINK_REQUIRED_SCOPES has a blank entry")
        if self.authz_san and self.authz_san == self.envoy_san:
            raise ValueError("STOA_LINK_AUTHZ_SAN must differ from STOA_LINK_ENVOY_SAN")
        if self.proc_san and self.proc_san in (self.envoy_san, self.authz_san):
            raise ValueError(
                "STOA_LINK_PROC_SAN must differ from STOA_LINK_ENVOY_SAN and STOA_LINK_AUTHZ_SAN"
            )
        if self.mcp_san and self.mcp_san in (self.envoy_san, self.authz_san, self.proc_san):
            raise ValueError("STOA_LINK_MCP_SAN must differ from the other services' SANs")
