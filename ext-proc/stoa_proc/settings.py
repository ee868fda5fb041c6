"""Settings of the processing service: `STOA_PROC_*` environment variables plus `STOA_ENV` (what the
site services share is `stoa_ops.site_settings`)."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import SettingsConfigDict
from stoa_ops.site_settings import ConfigError, SiteSettings

__all__ = ["ConfigError", "Settings", "check"]


class Settings(SiteSettings):
    model_config = SettingsConfigDict(env_prefix="STOA_PROC_", extra="ignore")

    grpc_address: str = "127.0.0.1:9291"
    http_address: str = "127.0.0.1:9292"
    # How many accepted policy sets stay available for routes built with an older one.
    policy_sets_kept: int = Field(default=4, ge=1, le=64)
    # The largest body inspected whatever a policy says (and a policy's limit when it sets none);
    # keep it at or under Envoy's per-connection buffer limit (1 MiB by default).
    max_body_bytes: int = Field(default=1024 * 1024, ge=1)
    # A compressed body may expand at most this many times when decoded for inspection.
    max_inflate_ratio: int = Field(default=100, ge=1)
    # PostgreSQL of the token budgets' counters (the quota store, a libpq URL); without it every
    # request on a route with a token budget is refused (quota_unavailable). Never logged.
    database_url: str = ""
    # Longest wait for a connection or a reservation; past it the store counts as unreachable.
    quota_timeout_s: float = Field(default=0.5, gt=0, le=10)
    quota_pool_size: int = Field(default=8, ge=1, le=64)
    # While the store is unreachable, requests under a non-billed budget pass uncounted for at most
    # this long; then they are refused (billed budgets are refused at once).
    budget_degraded_s: float = Field(default=5.0, ge=0)


def check(settings: Settings) -> list[str]:
    """Raise ConfigError for settings that must refuse start-up; return warnings for the rest."""
    refused, warnings = settings.site_checks()
    if refused:
        raise ConfigError("refusing to start in production: " + "; ".join(refused))
    if not settings.database_url:
        warnings.append("STOA_PROC_DATABASE_URL is not set: routes with a token budget are refused")
    return warnings
