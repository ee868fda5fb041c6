"""CP settings, read from `STOA_CP_*` environment variables plus `STOA_ENV`."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AliasChoices, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict
from stoa_translate.policies import ListLimits


def _split(value: object) -> object:
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STOA_CP_", extra="ignore")

    env: Literal["development", "production"] = Field(
        default="development", validation_alias=AliasChoices("STOA_ENV")
    )
    database_url: str = Field(description="PostgreSQL DSN (postgresql://user:pass@host:port/db)")
    # Comma-separated in the environment. Bootstrap only: refused with STOA_ENV=production.
    admin_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Comma-separated issuer URLs whose tokens the CP API accepts (keys found through OIDC discovery).
    oidc_issuers: Annotated[list[str], NoDecode] = Field(default_factory=list)
    oidc_audience: str = "stoa-cp"
    roles_claim: str = Field(default="stoa_roles", min_length=1)
    tenant_claim: str = Field(default="tenant_id", min_length=1)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    jwks_fetch_timeout_s: float = Field(default=3.0, gt=0, le=60)
    jwks_refresh_s: float = Field(default=300.0, gt=0)
    # Past this long without an adopted fetch, an issuer's keys leave the inventories (tokens refused).
    issuer_stale_after_s: float = Field(default=86_400.0, gt=0)
    sse_ping_s: float = Field(default=15.0, gt=0)
    pool_min_size: int = Field(default=2, ge=1)
    pool_max_size: int = Field(default=10, ge=1)
    log_level: str = "info"
    # The Envoy binary `GET /v1/gateways/{g}/preview?validate=envoy` runs; empty: `envoy` on PATH.
    envoy_binary: str = ""
    # Every wait on the database is bounded; past a bound the call answers 503 with Retry-After.
    db_connect_timeout_s: float = Field(default=5.0, gt=0, le=300)
    db_acquire_timeout_s: float = Field(default=5.0, gt=0, le=300)
    db_statement_timeout_s: float = Field(default=10.0, gt=0, le=3600)
    db_transaction_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    db_retry_after_s: int = Field(default=5, ge=1, le=3600)
    ready_timeout_s: float = Field(default=2.0, gt=0, le=60)
    # Limits: each refusal names the limit (413 for a body, 422 for a count).
    max_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    bulk_max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    bulk_max_items: int = Field(default=50_000, ge=1)
    max_routes_per_tenant: int = Field(default=20_000, ge=1)
    policy_max_origins: int = Field(default=1_000, ge=1)
    policy_max_headers: int = Field(default=1_000, ge=1)
    policy_max_addresses: int = Field(default=10_000, ge=1)
    policy_max_patterns: int = Field(default=100, ge=1)
    policy_max_entries: int = Field(default=256, ge=1)
    # MCP tool permissions: the directory of Ed25519 signing keys (*.pem; the last by name signs).
    # Empty: nothing is signed, and every site's MCP module denies every tool.
    mcp_signing_key_dir: str = ""
    mcp_permissions_issuer: str = "stoa-cp"
    # How long a signed artifact is valid (at most 15 min); re-signed once past half its life.
    mcp_permissions_lifetime_s: int = Field(default=600, ge=1, le=900)
    # How often the keeper looks for artifacts to re-sign (it also wakes on every gateway change).
    mcp_permissions_check_s: float = Field(default=10.0, gt=0)
    # Where the console (/console) signs people in: an issuer with an authorization endpoint and PKCE;
    # empty: the first of OIDC_ISSUERS. The console is a public client of that issuer.
    console_issuer: str = ""
    console_client_id: str = Field(default="stoa-console", min_length=1)

    @property
    def console_sign_in_issuer(self) -> str | None:
        return self.console_issuer or (self.oidc_issuers[0] if self.oidc_issuers else None)

    @property
    def policy_limits(self) -> ListLimits:
        """How many entries a policy's lists may hold."""
        return ListLimits(
            origins=self.policy_max_origins,
            headers=self.policy_max_headers,
            addresses=self.policy_max_addresses,
            patterns=self.policy_max_patterns,
            entries=self.policy_max_entries,
        )

    @field_validator("admin_tokens", "oidc_issuers", mode="before")
    @classmethod
    def _split_lists(cls, value: object) -> object:
        return _split(value)

    @field_validator("oidc_issuers")
    @classmethod
    def _issuer_urls(cls, value: list[str]) -> list[str]:
        for issuer in value:
            if not issuer.startswith(("https://", "http://")):
                raise ValueError(f"{issuer!r} is not an http(s) issuer URL")
        return value

    @model_validator(mode="after")
    def _production(self) -> Settings:
        # A shared static secret names nobody: production callers carry their own identity.
        if self.env == "production" and self.admin_tokens:
            raise ValueError(
                "STOA_CP_ADMIN_TOKENS is for bootstrap only and is refused with STOA_ENV=production;"
                " give platform admins tokens from a trusted issuer (STOA_CP_OIDC_ISSUERS)"
            )
        return self
