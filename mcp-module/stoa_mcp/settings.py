"""Settings of the MCP module: `STOA_MCP_*` environment variables plus `STOA_ENV` (what the site
services share is `stoa_ops.site_settings`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar

from pydantic import Field, field_validator
from pydantic_settings import NoDecode, SettingsConfigDict
from stoa_ops.site_settings import ConfigError, SiteSettings

__all__ = ["ConfigError", "Settings", "check"]


class Settings(SiteSettings):
    model_config = SettingsConfigDict(env_prefix="STOA_MCP_", extra="ignore")
    service_addresses: ClassVar[tuple[str, ...]] = ("mcp_address", "http_address")

    # Where Envoy sends the MCP routes (the Link's STOA_LINK_MCP_ADDRESS).
    mcp_address: str = "127.0.0.1:9391"
    # Operator endpoint: /health/live, /health/ready, /metrics.
    http_address: str = "127.0.0.1:9392"
    # The gateway this module serves: the `aud` every signed tool-permission artifact must name.
    gateway_id: str = ""
    # The `iss` of the artifacts (the CP's STOA_CP_MCP_PERMISSIONS_ISSUER).
    permissions_issuer: str = "stoa-cp"
    # The pinned public keys of the artifacts' signers: a JWKS file (Ed25519 keys, each with its kid).
    # During a rotation it holds the old and the new key.
    trusted_keys: Path | None = None
    # The authorization service's published envelope keys (its /.well-known/jwks.json) and issuer.
    envelope_jwks_url: str = "http://127.0.0.1:9192/.well-known/jwks.json"
    envelope_issuer: str = "stoa-ext-authz"
    # The longest a backing API may take to answer a tools/call (a tool's API timeout, when set and
    # shorter, applies instead).
    upstream_timeout_ms: int = Field(default=10_000, ge=1, le=300_000)
    # Tolerated clock difference with the CP and the authorization service.
    clock_skew_s: int = Field(default=30, ge=0, le=300)
    # DNS-rebinding protection (MCP transport security): the Host values (host:port, "*" for any port)
    # and Origin values the gateway is reached with; comma-separated. Empty: not checked (a warning).
    allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    allowed_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # MCP budgets: the PostgreSQL quota store (empty: no budgets can be counted, so a tool with a
    # budget is refused: fail closed).
    database_url: str = ""

    @field_validator("allowed_hosts", "allowed_origins", mode="before")
    @classmethod
    def _split(cls, value: object) -> object:
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value


def check(settings: Settings) -> list[str]:
    """Raise ConfigError for settings that must refuse start-up; return warnings for the rest."""
    refused, warnings = settings.site_checks()
    if not settings.gateway_id:
        raise ConfigError("STOA_MCP_GATEWAY_ID is required (the audience of the tool permissions)")
    if settings.trusted_keys is None:
        raise ConfigError("STOA_MCP_TRUSTED_KEYS is required (the pinned keys of the tool permissions)")
    if refused:
        raise ConfigError("refusing to start in production: " + "; ".join(refused))
    if not settings.allowed_hosts:
        warnings.append("STOA_MCP_ALLOWED_HOSTS is empty: Host and Origin are not checked (DNS rebinding)")
    return warnings
