"""Validation of policy configs for the types the Link translates (cors, rate_limit, ip_filter).

Other types are stored as given (a JSON object): the Link refuses them, and that refusal is
product behaviour that is tested end to end.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr
from pydantic import ValidationError as PydanticValidationError

from stoa_cp.problems import Problem, field_path
from stoa_cp.schemas import HTTP_METHODS

_WILDCARD_ORIGIN = re.compile(r"^https?://\*(\.[A-Za-z0-9-]+){2,}(:\d{1,5})?$")
_EXACT_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d{1,5})?$|^https?://\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")
_HEADER = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")
# Envoy's token bucket and the Link take 32-bit unsigned counts; a larger value would be refused there.
MAX_COUNT = 2**32 - 1


def _origin(value: str) -> str:
    if value == "*" or _EXACT_ORIGIN.match(value) or _WILDCARD_ORIGIN.match(value):
        return value
    raise ValueError(
        "must be '*', an exact origin (https://app.example.com[:port]) "
        "or a subdomain wildcard (https://*.example.com)"
    )


def _method(value: str) -> str:
    if value.upper() not in HTTP_METHODS:
        raise ValueError(f"must be one of {', '.join(HTTP_METHODS)}")
    return value.upper()


def _header(value: str) -> str:
    if not _HEADER.match(value):
        raise ValueError("must be an HTTP header name")
    return value


def _address(value: str) -> str:
    try:
        ipaddress.ip_network(value, strict=True)
    except ValueError as exc:
        raise ValueError(f"must be a CIDR or a single IPv4/IPv6 address ({exc})") from None
    return value


Origin = Annotated[StrictStr, AfterValidator(_origin)]
Method = Annotated[StrictStr, AfterValidator(_method)]
Header = Annotated[StrictStr, AfterValidator(_header)]
Address = Annotated[StrictStr, AfterValidator(_address)]


class _Config(BaseModel):
    model_config = ConfigDict(extra="forbid")


class CorsConfig(_Config):
    allowedOrigins: list[Origin] = Field(min_length=1)
    allowedMethods: list[Method] = []
    allowedHeaders: list[Header] = []
    exposeHeaders: list[Header] = []
    maxAge: StrictInt | None = Field(default=None, ge=0, le=MAX_COUNT)
    allowCredentials: StrictBool = False


class RateLimitConfig(_Config):
    maxRequests: StrictInt = Field(ge=1, le=MAX_COUNT)
    intervalSeconds: StrictInt = Field(ge=1, le=MAX_COUNT)


class IpFilterConfig(_Config):
    mode: Literal["allow", "deny"]
    ip_list: list[Address] = Field(min_length=1)


VALIDATED_TYPES: dict[str, type[_Config]] = {
    "cors": CorsConfig,
    "rate_limit": RateLimitConfig,
    "ip_filter": IpFilterConfig,
}


def check(policy_type: str, config: dict[str, Any]) -> None:
    """Raise a 422 Problem naming each bad `config.*` field; unknown types pass (stored as given)."""
    model = VALIDATED_TYPES.get(policy_type)
    if model is None:
        return
    try:
        parsed = model.model_validate(config)
    except PydanticValidationError as exc:
        errors = [
            (field_path(("config", *err["loc"])), str(err["msg"]).removeprefix("Value error, "))
            for err in exc.errors()
        ]
        raise Problem(422, "Invalid policy config", errors) from None
    if isinstance(parsed, CorsConfig) and parsed.allowCredentials and "*" in parsed.allowedOrigins:
        raise Problem(
            422,
            "Invalid policy config",
            [("config.allowCredentials", "cannot be true when allowedOrigins contains '*'")],
        )
