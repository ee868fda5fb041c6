"""Settings of the authorization service: `STOA_AUTHZ_*` environment variables plus `STOA_ENV` (what the
site services share is `stoa_ops.site_settings`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import SettingsConfigDict
from stoa_ops.site_settings import ConfigError, DecisionSettings, SiteSettings

__all__ = ["ConfigError", "Settings", "check"]


class Settings(SiteSettings, DecisionSettings):
    model_config = SettingsConfigDict(env_prefix="STOA_AUTHZ_", extra="ignore")

    grpc_address: str = "127.0.0.1:9191"
    http_address: str = "127.0.0.1:9192"
    # How many accepted policy sets stay available for routes built with an older one.
    policy_sets_kept: int = Field(default=4, ge=1, le=64)
    signing_key_file: Path | None = None
    identity_issuer: str = "stoa-ext-authz"
    workers: int = Field(default=1, ge=1, le=64)
    # Threads deciding Checks in one process (the GIL makes more than a few pointless).
    grpc_threads: int = Field(default=4, ge=1, le=64)
    grpc_max_concurrent_streams: int = Field(default=1000, ge=1)
    # Set by the parent for its worker processes: share the ports with SO_REUSEPORT.
    reuse_port: bool = False
    token_cache_size: int = Field(default=10_000, ge=0)
    jwks_fetch_timeout_s: float = Field(default=2.0, gt=0, le=30)
    # PostgreSQL of the quota counters (a libpq URL); without it every subscribed request is denied
    # (quota_unavailable). Never logged.
    database_url: str = ""
    # Longest wait for a connection or a count; past it a billed request is quota_unavailable.
    quota_timeout_s: float = Field(default=0.5, gt=0, le=10)
    # Non-billed counts are sent to PostgreSQL this often.
    quota_flush_interval_s: float = Field(default=0.1, gt=0, le=10)
    # While PostgreSQL is unreachable, each non-billed counter admits at most this many more requests
    # (never beyond its limit as this process knows it) ...
    quota_degraded_overshoot: int = Field(default=10, ge=0)
    # ... for at most this long; then every non-billed request is quota_unavailable until it is back.
    quota_degraded_max_s: float = Field(default=5.0, ge=0)


def check(settings: Settings) -> list[str]:
    """Raise ConfigError for settings that must refuse start-up; return warnings for the rest."""
    refused, site_warnings = settings.site_checks()
    warnings: list[str] = []
    blank = settings.blank_scope
    if settings.env == "production":
        problems = []
        if not settings.audience.strip():
            problems.append("STOA_AUTHZ_AUDIENCE is not set")
        if not settings.required_scopes:
            problems.append("STOA_AUTHZ_REQUIRED_SCOPES is empty")
        if blank:
            problems.append("STOA_AUTHZ_REQUIRED_SCOPES has a blank entry")
        problems.extend(refused)
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
    if not settings.database_url:
        warnings.append(
            "STOA_AUTHZ_DATABASE_URL is not set: subscribed requests are denied (quota_unavailable)"
        )
    return warnings + site_warnings
