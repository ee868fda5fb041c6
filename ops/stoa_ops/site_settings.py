"""What the site services' settings share (the authorization and processing services, the MCP
module): the environment, the Link's ADS address and the TLS files for it, the checks on their own
addresses; the decision settings the authorization service and the Link share; reading the settings at
start-up.

Each service subclasses `SiteSettings` with its `env_prefix`, its addresses (named in
`service_addresses`, the first being where it serves) and its own fields.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import grpc
from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from stoa_ops.address import is_loopback, split_host_port
from stoa_ops.policy_sets import channel_credentials


class ConfigError(Exception):
    """A setting that makes the service unable to enforce; start-up is refused with this message."""


class SiteSettings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore")

    env: Literal["development", "production"] = Field(
        default="development", validation_alias=AliasChoices("STOA_ENV")
    )
    # The service's own address settings, where it serves first; each is checked, and warned of when
    # not loopback (these listeners have no TLS of their own).
    service_addresses: ClassVar[tuple[str, ...]] = ("grpc_address", "http_address")
    ads_address: str = "127.0.0.1:18000"
    # Name checked against the ADS server certificate when it differs from the address host.
    ads_server_name: str = ""
    tls_ca: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None

    @property
    def prefix(self) -> str:
        return str(self.model_config.get("env_prefix", ""))

    @property
    def tls_files(self) -> tuple[Path, Path, Path] | None:
        if self.tls_ca and self.tls_cert and self.tls_key:
            return self.tls_ca, self.tls_cert, self.tls_key
        return None

    def ads_credentials(self) -> grpc.ChannelCredentials | None:
        """TLS for the ADS stream from the three files, or None (plain, development only)."""
        if self.tls_files is None:
            return None
        ca, cert, key = (path.read_bytes() for path in self.tls_files)
        return channel_credentials(ca, cert, key)

    def address(self, name: str) -> tuple[str, int]:
        """`host:port` of the address setting `name`; ConfigError (start-up refused) when it is not one."""
        try:
            example = getattr(self, self.service_addresses[0])
            return split_host_port(getattr(self, name), f"{self.prefix}{name.upper()}", example)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def site_checks(self) -> tuple[list[str], list[str]]:
        """(what production refuses, warnings). Raises ConfigError for an address that is not
        `host:port` and for TLS files given in part."""
        for name in (*self.service_addresses, "ads_address"):
            self.address(name)
        p = self.prefix
        if self.tls_files is None and any((self.tls_ca, self.tls_cert, self.tls_key)):
            raise ConfigError(f"{p}TLS_CA, {p}TLS_CERT and {p}TLS_KEY go together")
        refused: list[str] = []
        warnings: list[str] = []
        if self.tls_files is None:
            if self.env == "production":
                refused.append(f"{p}TLS_CA, {p}TLS_CERT and {p}TLS_KEY must all be set")
            else:
                warnings.append(
                    "no ADS client certificate configured: connecting to the ADS server without TLS"
                )
        for name in self.service_addresses:
            host, _ = self.address(name)
            if not is_loopback(host):
                warnings.append(f"{name} {getattr(self, name)} is not loopback and has no TLS of its own")
        return refused, warnings


class DecisionSettings(BaseSettings):
    """What a decision depends on, set to the same values for the authorization service and for the
    Link (which lets Envoy decide as the service would): each reads them under its own prefix."""

    model_config = SettingsConfigDict(extra="ignore")

    # Every token must name this audience; without it every request is denied (not_configured) and no
    # route is decided by Envoy.
    audience: str = ""
    # Comma-separated; blank entries are kept so that they can be refused, never silently dropped.
    required_scopes: Annotated[list[str], NoDecode] = Field(default_factory=list)
    tenant_claim: str = "tenant_id"
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
    def blank_scope(self) -> bool:
        """A blank entry in the required scopes (`a, ,b`): refused at start-up."""
        return any(not scope for scope in self.required_scopes)


S = TypeVar("S", bound=SiteSettings)


def refuse(program: str, log: logging.Logger, message: str) -> int:
    """Log and print why start-up is refused; the exit code."""
    log.error(message)
    print(f"{program}: {message}", file=sys.stderr)
    return 2


def read(
    program: str, log: logging.Logger, settings_type: type[S], check: Callable[[S], list[str]]
) -> S | int:
    """The settings from the environment, checked, their warnings logged; or the exit code of a
    refused start-up (the reason logged and printed)."""
    try:
        settings = settings_type()
        warnings = check(settings)
    except ValidationError as exc:
        return refuse(program, log, f"invalid settings: {exc}")
    except ConfigError as exc:
        return refuse(program, log, str(exc))
    for warning in warnings:
        log.warning(warning)
    return settings


def run_service(
    program: str,
    log: logging.Logger,
    settings_type: type[S],
    check: Callable[[S], list[str]],
    serve: Callable[[S], Coroutine[Any, Any, None]],
    run: Callable[[Coroutine[Any, Any, None]], None] = asyncio.run,
    refused: tuple[type[Exception], ...] = (),
) -> int:
    """A site service's start: its settings read and checked, then `serve(settings)` on an event loop
    (`run`) until it returns; the exit code. Start-up is refused (2, the reason logged and printed) for
    settings, for the `refused` errors `serve` raises at start and for a listener that cannot start."""
    settings = read(program, log, settings_type, check)
    if isinstance(settings, int):
        return settings
    try:
        run(serve(settings))
    except refused as exc:
        return refuse(program, log, str(exc))
    except OSError as exc:
        return refuse(program, log, f"cannot start: {exc}")
    return 0
