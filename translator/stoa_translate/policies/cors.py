"""cors → `envoy.filters.http.cors`, configured per route.

A genuine preflight (OPTIONS + Origin + Access-Control-Request-Method from an allowed origin) is
answered by Envoy; a preflight from an origin the policy does not allow goes on like any request.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from google.protobuf import message, wrappers_pb2
from stoa_proto import inventory_pb2

from stoa_translate import fields
from stoa_translate.filters import CORS_FILTER
from stoa_translate.policies.kind import ConfigError, PolicyKind, mirrored

_EXACT_ORIGIN = re.compile(r"^https?://[A-Za-z0-9.-]+(:\d{1,5})?$|^https?://\[[0-9A-Fa-f:.]+\](:\d{1,5})?$")
# Any subdomain of a domain of at least two labels, at any depth.
_WILDCARD_ORIGIN = re.compile(r"^https?://\*(\.[A-Za-z0-9-]+){2,}(:\d{1,5})?$")


@dataclass(frozen=True)
class Cors:
    policy_id: str
    allowed_origins: tuple[str, ...]
    allowed_methods: tuple[str, ...]
    allowed_headers: tuple[str, ...]
    expose_headers: tuple[str, ...]
    max_age: int | None
    allow_credentials: bool


def parse(policy_id: str, config: inventory_pb2.CorsPolicy) -> Cors:
    if not config.allowed_origins:
        raise ConfigError("allowedOrigins", "must hold at least one origin")
    for i, origin in enumerate(config.allowed_origins):
        if not (origin == "*" or _EXACT_ORIGIN.match(origin) or _WILDCARD_ORIGIN.match(origin)):
            raise ConfigError(
                f"allowedOrigins[{i}]",
                "must be '*', an exact origin (https://app.example.com[:port]) "
                "or a subdomain wildcard (https://*.example.com)",
            )
    methods = []
    for i, method in enumerate(config.allowed_methods):
        try:
            methods.append(fields.method(method))
        except ValueError as exc:
            raise ConfigError(f"allowedMethods[{i}]", str(exc)) from None
    for key, headers in (
        ("allowedHeaders", config.allowed_headers),
        ("exposeHeaders", config.expose_headers),
    ):
        for i, header in enumerate(headers):
            if not fields.is_header_name(header):
                raise ConfigError(f"{key}[{i}]", "must be an HTTP header name")
    if config.allow_credentials and "*" in config.allowed_origins:
        raise ConfigError("allowCredentials", "cannot be true when allowedOrigins contains '*'")
    return Cors(
        policy_id=policy_id,
        allowed_origins=tuple(dict.fromkeys(config.allowed_origins)),
        allowed_methods=tuple(dict.fromkeys(methods)),
        allowed_headers=tuple(dict.fromkeys(config.allowed_headers)),
        expose_headers=tuple(dict.fromkeys(config.expose_headers)),
        max_age=config.max_age if config.HasField("max_age") else None,
        allow_credentials=config.allow_credentials,
    )


def normalised(cors: Cors) -> inventory_pb2.CorsPolicy:
    return mirrored(cors, inventory_pb2.CorsPolicy)


def listener_filter() -> message.Message:
    return cors_pb2.Cors()


def origin_matcher(origin: str) -> string_pb2.StringMatcher:
    """An exact origin, `*` (any origin) or `scheme://*.domain` (any subdomain, at any depth)."""
    if origin == "*":
        return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=".*"))
    if "*" in origin:
        scheme, rest = origin.split("://*.", 1)
        domain, _, port = rest.partition(":")
        suffix = domain.replace(".", "\\.") + (":" + port if port else "")
        return string_pb2.StringMatcher(
            safe_regex=regex_pb2.RegexMatcher(regex=f"{scheme}://[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*\\.{suffix}")
        )
    return string_pb2.StringMatcher(exact=origin)


def route_config(route_id: str, cors: Cors) -> cors_pb2.CorsPolicy:
    policy = cors_pb2.CorsPolicy(
        allow_origin_string_match=[origin_matcher(o) for o in cors.allowed_origins],
        allow_credentials=wrappers_pb2.BoolValue(value=cors.allow_credentials),
        # A preflight from an origin the policy does not allow goes on to ext_authz like any request.
        forward_not_matching_preflights=wrappers_pb2.BoolValue(value=True),
    )
    if cors.allowed_methods:
        policy.allow_methods = ",".join(cors.allowed_methods)
    if cors.allowed_headers:
        policy.allow_headers = ",".join(cors.allowed_headers)
    if cors.expose_headers:
        policy.expose_headers = ",".join(cors.expose_headers)
    if cors.max_age is not None:
        policy.max_age = str(cors.max_age)
    return policy


# OPTIONS is matched on a method-constrained route only while a cors policy applies, for the preflight.
KIND = PolicyKind(
    "cors",
    CORS_FILTER,
    inventory_pb2.CorsPolicy,
    parse,
    normalised,
    listener_filter,
    route_config,
    extra_methods=("OPTIONS",),
    list_limits={"allowedOrigins": "origins", "allowedHeaders": "headers", "exposeHeaders": "headers"},
)
