"""CP settings, read from `STOA_CP_*` environment variables."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="STOA_CP_", extra="ignore")

    database_url: str = Field(description="PostgreSQL DSN (postgresql://user:pass@host:port/db)")
    # Comma-separated in the environment. Empty means no admin request is ever accepted (fail closed).
    admin_tokens: Annotated[list[str], NoDecode] = Field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    jwks_fetch_timeout_s: float = Field(default=3.0, gt=0, le=60)
    jwks_refresh_s: float = Field(default=300.0, gt=0)
    sse_ping_s: float = Field(default=15.0, gt=0)
    pool_min_size: int = Field(default=2, ge=1)
    pool_max_size: int = Field(default=10, ge=1)
    log_level: str = "info"

    @field_validator("admin_tokens", mode="before")
    @classmethod
    def _split_tokens(cls, value: object) -> object:
        if isinstance(value, str):
            return [token.strip() for token in value.split(",") if token.strip()]
        return value
