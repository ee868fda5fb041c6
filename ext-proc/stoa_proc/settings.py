"""Settings of the processing service: `STOA_PROC_*` environment variables plus `STOA_ENV`."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from stoa_ops.address import is_loopback, split_host_port


class ConfigError(Exception):
    """A setting that makes the service unable to enforce; start-up is refused with this message."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STOA_PROC_", extra="ignore")

    env: Literal["development", "production"] = Field(
        default="development", validation_alias=AliasChoices("STOA_ENV")
    )
    grpc_address: str = "127.0.0.1:9291"
    http_address: str = "127.0.0.1:9292"
    ads_address: str = "127.0.0.1:18000"
    # Name checked against the ADS server certificate when it differs from the address host.
    ads_server_name: str = ""
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    # The largest body inspected whatever a policy says (and a policy's limit when it sets none);
    # keep it at or under Envoy's per-connection buffer limit (1 MiB by default).
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    # A compressed body may expand at most this many times when decoded for inspection.
    max_inflate_ratio: int = Field(default=100, ge=1)
    # How many accepted policy sets stay available for routes built with an older one.
    policy_sets_kept: int = Field(default=4, ge=1, le=64)

    @property
    def tls_files(self) -> tuple[Path, Path, Path] | None:
        if self.tls_ca and self.tls_cert and self.tls_key:
            return self.tls_ca, self.tls_cert, self.tls_key
        return None


def split_address(address: str, name: str) -> tuple[str, int]:
    """`host:port` of the setting `name`; ConfigError (start-up refused) when it is not one."""
    try:
        return split_host_port(address, f"STOA_PROC_{name.upper()}", "127.0.0.1:9291")
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def check(settings: Settings) -> list[str]:
    """Raise ConfigError for settings that must refuse start-up; return warnings for the rest."""
    warnings: list[str] = []
    for name in ("grpc_address", "http_address", "ads_address"):
        split_address(getattr(settings, name), name)
    partial_tls = settings.tls_files is None and any((settings.tls_ca, settings.tls_cert, settings.tls_key))
    if partial_tls:
        raise ConfigError("STOA_PROC_TLS_CA, STOA_PROC_TLS_CERT and STOA_PROC_TLS_KEY go together")
    if settings.tls_files is None:
        if settings.env == "production":
            raise ConfigError("refusing to start in production: STOA_PROC_TLS_CA, _CERT and _KEY must be set")
        warnings.append("no ADS client certificate configured: connecting to the ADS server without TLS")
    for name in ("grpc_address", "http_address"):
        host, _ = split_address(getattr(settings, name), name)
        if not is_loopback(host):
            warnings.append(f"{name} {getattr(settings, name)} is not loopback and has no TLS of its own")
    return warnings
