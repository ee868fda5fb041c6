"""Settings of the authorization service: `STOA_AUTHZ_*` environment variables plus `STOA_ENV`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from stoa_ops.address import is_loopback, split_host_port


class ConfigError(Exception):
    """A setting that makes the service unable to enforce; start-up is refused with this message."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STOA_AUTHZ_", extra="ignore")

    env: Literal["development", "production"] = Field(
        default="development", validation_alias=AliasChoices("STOA_ENV")
    )
    grpc_address: str = "127.0.0.1:9191"
    http_address: str = "127.0.0.1:9192"
    # Every token must name this audience; without it every request is denied (not_configured).
    audience: str = ""
    # Comma-separated; blank entries are kept so that production can refuse them.
    required_scopes: Annotated[list[str], NoDecode] = Field(default_factory=list)
    tenant_claim: str = "tenant_id"
    ads_address: str = "127.0.0.1:18000"
    # Name checked against the ADS server certificate when it differs from the address host.
    ads_server_name: str = ""
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    signing_key_file: Path | None = None
    identity_issuer: str = "stoa-ext-authz"
    workers: int = Field(default=1, ge=1, le=64)
    # Threads deciding Checks in one process (the GIL makes more than a few pointless).
    grpc_threads: int = Field(default=4, ge=1, le=64)
    grpc_max_concurrent_streams: int = Field(default=1000, ge=1)
    # Set by the parent for its worker processes: share the ports with SO_REUSEPORT.
    reuse_port: bool = False
    # How many accepted policy sets stay available for routes built with an older one.
    policy_sets_kept: int = Field(default=4, ge=1, le=64)
    token_cache_size: int = Field(default=10_000, ge=0)
    jwks_fetch_timeout_s: float = Field(default=2.0, gt=0, le=30)
    # Longest token lifetime honoured: exp - iat, or exp - now for a token without iat.
    max_token_lifetime_s: int = Field(default=86_400, ge=60)

    @field_validator("audience")
    @classmethod
    def _strip_audience(cls, value: str) -> str:
        # A blank audience is no audience: not_configured and not ready, never "ready for ' '".
        return value.strip()

    @field_validator("required_scopes", mode="before")
    @classmethod
    def _split_scopes(cls, value: object) -> object:
        if isinstance(value, str):
            return [] if value.strip() == "" else [part.strip() for part in value.split(",")]
        return value

    @property
    def tls_files(self) -> tuple[Path, Path, Path] | None:
        if self.tls_ca and self.tls_cert and self.tls_key:
            return self.tls_ca, self.tls_cert, self.tls_key
        return None


def split_address(address: str, name: str) -> tuple[str, int]:
    """`host:port` of the setting `name`; ConfigError (start-up refused) when it is not one."""
    try:
        return split_host_port(address, f"STOA_AUTHZ_{name.upper()}", "127.0.0.1:9191")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check(settings: Settings) -> list[str]:
    """Raise ConfigError for settings that must refuse start-up; return warnings for the rest."""
    warnings: list[str] = []
    production = settings.env == "production"
    for name in ("grpc_address", "http_address", "ads_address"):
        split_address(getattr(settings, name), name)
    blank = [s for s in settings.required_scopes if not s]
    if production:
        problems = []
        if not settings.audience.strip():
            problems.append("STOA_AUTHZ_AUDIENCE is not set")
        if not settings.required_scopes:
            problems.append("STOA_AUTHZ_REQUIRED_SCOPES is empty")
        if blank:
            problems.append("STOA_AUTHZ_REQUIRED_SCOPES has a blank entry")
        if settings.tls_files is None:
            problems.append("STOA_AUTHZ_TLS_CA, STOA_AUTHZ_TLS_CERT and STOA_AUTHZ_TLS_KEY must all be set")
        if settings.signing_key_file is None:
            problems.append("STOA_AUTHZ_SIGNING_KEY_FILE is not set")
        if problems:
            raise ConfigError("refusing to start in production: " + "; ".join(problems))
    else:
        if not settings.audience.strip():
            warnings.append("STOA_AUTHZ_AUDIENCE is not set: every request will be denied (not_configured)")
        if blank:
            raise ConfigError("STOA_AUTHZ_REQUIRED_SCOPES has a blank entry")
        if not settings.required_scopes:
            warnings.append("STOA_AUTHZ_REQUIRED_SCOPES is empty: only route scopes are required")
        if settings.tls_files is None and any((settings.tls_ca, settings.tls_cert, settings.tls_key)):
            raise ConfigError("STOA_AUTHZ_TLS_CA, STOA_AUTHZ_TLS_CERT and STOA_AUTHZ_TLS_KEY go together")
        if settings.tls_files is None:
            warnings.append("no ADS client certificate configured: connecting to the ADS server without TLS")
    for name in ("grpc_address", "http_address"):
        host, _ = split_address(getattr(settings, name), name)
        if not is_loopback(host):
            warnings.append(f"{name} {getattr(settings, name)} is not loopback and has no TLS of its own")
    return warnings
