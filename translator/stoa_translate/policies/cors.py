"""cors → `envoy.filters.http.cors`, configured per route.

A genuine preflight (OPTIONS + Origin + Access-Control-Request-Method from an allowed origin) is
answered by Envoy; a preflight from an origin the policy does not allow goes on like any request.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from google.protobuf import message, wrappers_pb2

from stoa_translate.filters import CORS_FILTER
from stoa_translate.policies.kind import ConfigReader, PolicyKind

_METHOD = re.compile(r"^[A-Z]+$")
_WILDCARD_ORIGIN = re.compile(r"^(https?)://\*\.([A-Za-z0-9.-]+)(:\d{1,5})?$")


@dataclass(frozen=True)
class Cors:
    policy_id: str
    allowed_origins: tuple[str, ...]
    allowed_methods: tuple[str, ...]
    allowed_headers: tuple[str, ...]
    expose_headers: tuple[str, ...]
    max_age: int | None
    allow_credentials: bool


def parse(policy_id: str, config: Mapping[str, Any]) -> Cors:
    c = ConfigReader(
        policy_id,
        config,
        ("allowedOrigins", "allowedMethods", "allowedHeaders", "exposeHeaders", "maxAge", "allowCredentials"),
    )
    origins = c.strings("allowedOrigins", required=True)
    for origin in origins:
        if origin != "*" and "*" in origin and not _WILDCARD_ORIGIN.match(origin):
            raise c.invalid("allowedOrigins", f"entry {origin!r} is not an origin, '*' or scheme://*.domain")
    methods = c.strings("allowedMethods")
    if not all(_METHOD.match(m) for m in methods):
        raise c.invalid("allowedMethods", "must hold upper-case HTTP methods")
    credentials = c.boolean("allowCredentials")
    if credentials and "*" in origins:
        raise c.invalid("allowCredentials", "cannot be true with the '*' origin")
    return Cors(
        policy_id=policy_id,
        allowed_origins=origins,
        allowed_methods=methods,
        allowed_headers=c.strings("allowedHeaders"),
        expose_headers=c.strings("exposeHeaders"),
        max_age=c.optional_integer("maxAge", minimum=0),
        allow_credentials=credentials,
    )


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
KIND = PolicyKind("cors", CORS_FILTER, parse, listener_filter, route_config, extra_methods=("OPTIONS",))
