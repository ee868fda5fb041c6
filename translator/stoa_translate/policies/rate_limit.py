"""rate_limit → `envoy.filters.http.local_ratelimit`: a token bucket per route and per Envoy process
(coarse protection); the 429 carries `Retry-After`."""

from __future__ import annotations

from dataclasses import dataclass

from envoy.config.core.v3 import base_pb2
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.extensions.filters.http.local_ratelimit.v3 import local_rate_limit_pb2
from envoy.type.v3 import percent_pb2, token_bucket_pb2
from google.protobuf import duration_pb2, message, wrappers_pb2
from stoa_proto import inventory_pb2

from stoa_translate.filters import RATE_LIMIT_FILTER
from stoa_translate.policies.kind import ConfigError, PolicyKind, mirrored

_ALL = base_pb2.RuntimeFractionalPercent(
    default_value=percent_pb2.FractionalPercent(
        numerator=100, denominator=percent_pb2.FractionalPercent.HUNDRED
    )
)


@dataclass(frozen=True)
class RateLimit:
    policy_id: str
    max_requests: int
    interval_seconds: int


def parse(policy_id: str, config: inventory_pb2.RateLimitPolicy) -> RateLimit:
    if config.max_requests < 1:
        raise ConfigError("maxRequests", "is required: a whole number of at least 1")
    if config.interval_seconds < 1:
        raise ConfigError("intervalSeconds", "is required: a whole number of at least 1")
    return RateLimit(policy_id, config.max_requests, config.interval_seconds)


def normalised(limit: RateLimit) -> inventory_pb2.RateLimitPolicy:
    return mirrored(limit, inventory_pb2.RateLimitPolicy)


def listener_filter() -> message.Message:
    # 0 % enabled at the listener: only a route's own config switches the bucket on.
    return local_rate_limit_pb2.LocalRateLimit(stat_prefix="stoa_rate_limit")


def route_config(route_id: str, limit: RateLimit) -> local_rate_limit_pb2.LocalRateLimit:
    # Not per downstream connection: one bucket per route shared by the whole Envoy process.
    return local_rate_limit_pb2.LocalRateLimit(
        stat_prefix=f"stoa_rate_limit_{route_id}",
        token_bucket=token_bucket_pb2.TokenBucket(
            max_tokens=limit.max_requests,
            tokens_per_fill=wrappers_pb2.UInt32Value(value=limit.max_requests),
            fill_interval=duration_pb2.Duration(seconds=limit.interval_seconds),
        ),
        filter_enabled=_ALL,
        filter_enforced=_ALL,
        enable_x_ratelimit_headers=ratelimit_pb2.DRAFT_VERSION_03,
        # The bucket refills fully once per interval: a client waiting that long gets through.
        response_headers_to_add=[
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="retry-after", value=str(limit.interval_seconds)),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        ],
    )


KIND = PolicyKind(
    "rate_limit",
    RATE_LIMIT_FILTER,
    inventory_pb2.RateLimitPolicy,
    parse,
    normalised,
    listener_filter,
    route_config,
)
