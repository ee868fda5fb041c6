"""The HTTP filters of the listener and the per-route configuration each policy renders to.

Filter names are shared by the listener (the chain) and the routes (typed_per_filter_config keys),
so both take them from here.
"""

from __future__ import annotations

from envoy.config.core.v3 import address_pb2, base_pb2
from envoy.config.rbac.v3 import rbac_pb2 as rbac_config_pb2
from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.extensions.filters.http.cors.v3 import cors_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.local_ratelimit.v3 import local_rate_limit_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.type.matcher.v3 import regex_pb2, string_pb2
from envoy.type.v3 import percent_pb2, token_bucket_pb2
from google.protobuf import any_pb2, duration_pb2, wrappers_pb2

from stoa_link.translate.ir import Cors, IpFilter, RateLimit, RouteIR

CORS_FILTER = "envoy.filters.http.cors"
RBAC_FILTER = "envoy.filters.http.rbac"
EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
RATE_LIMIT_FILTER = "envoy.filters.http.local_ratelimit"
ROUTER_FILTER = "envoy.filters.http.router"

_ALL = base_pb2.RuntimeFractionalPercent(
    default_value=percent_pb2.FractionalPercent(
        numerator=100, denominator=percent_pb2.FractionalPercent.HUNDRED
    )
)


def packed(message: object) -> any_pb2.Any:
    wrapped = any_pb2.Any()
    wrapped.Pack(message)  # type: ignore[arg-type]
    return wrapped


def per_route_configs(route: RouteIR) -> dict[str, any_pb2.Any]:
    """typed_per_filter_config of every route entry rendered for `route`."""
    configs = {EXT_AUTHZ_FILTER: packed(_ext_authz(route))}
    if route.cors is not None:
        configs[CORS_FILTER] = packed(_cors(route.cors))
    if route.ip_filter is not None:
        configs[RBAC_FILTER] = packed(_ip_filter(route.ip_filter))
    if route.rate_limit is not None:
        configs[RATE_LIMIT_FILTER] = packed(_rate_limit(route.route_id, route.rate_limit))
    return configs


def virtual_host_configs(policy_set_version: str) -> dict[str, any_pb2.Any]:
    """typed_per_filter_config of the virtual host: what every route shares.

    Envoy merges ext_authz context extensions from the virtual host into each route's (the more
    specific keys win), so a Check carries `policy_set_version` with the route's own keys while the
    route entries stay independent of the policy set: a new route re-renders only itself.
    """
    return {
        EXT_AUTHZ_FILTER: packed(
            ext_authz_pb2.ExtAuthzPerRoute(
                check_settings=ext_authz_pb2.CheckSettings(
                    context_extensions={"policy_set_version": policy_set_version}
                )
            )
        )
    }


def _ext_authz(route: RouteIR) -> ext_authz_pb2.ExtAuthzPerRoute:
    return ext_authz_pb2.ExtAuthzPerRoute(
        check_settings=ext_authz_pb2.CheckSettings(
            context_extensions={
                "tenant_id": route.tenant_id,
                "api_id": route.api_id,
                "route_id": route.route_id,
            }
        )
    )


def origin_matcher(origin: str) -> string_pb2.StringMatcher:
    """An exact origin, `*` (any origin) or `scheme://*.domain` (any subdomain, at any depth)."""
    if origin == "*":
        return string_pb2.StringMatcher(safe_regex=regex_pb2.RegexMatcher(regex=".*"))
    if "*" in origin:
        scheme, rest = origin.split("://*.", 1)
        domain, _, port = rest.partition(":")
        suffix = _re2_literal(domain) + (":" + port if port else "")
        return string_pb2.StringMatcher(
            safe_regex=regex_pb2.RegexMatcher(regex=f"{scheme}://[A-Za-z0-9-]+(\\.[A-Za-z0-9-]+)*\\.{suffix}")
        )
    return string_pb2.StringMatcher(exact=origin)


def _re2_literal(text: str) -> str:
    return text.replace(".", "\\.")


def _cors(cors: Cors) -> cors_pb2.CorsPolicy:
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


def _ip_filter(ip_filter: IpFilter) -> rbac_pb2.RBACPerRoute:
    # direct_remote_ip is the peer of the connection: forwarded-address headers never count.
    principals = [
        rbac_config_pb2.Principal(
            direct_remote_ip=address_pb2.CidrRange(
                address_prefix=address, prefix_len=wrappers_pb2.UInt32Value(value=length)
            )
        )
        for address, length in ip_filter.cidrs
    ]
    action = rbac_config_pb2.RBAC.ALLOW if ip_filter.mode == "allow" else rbac_config_pb2.RBAC.DENY
    return rbac_pb2.RBACPerRoute(
        rbac=rbac_pb2.RBAC(
            rules=rbac_config_pb2.RBAC(
                action=action,
                policies={
                    ip_filter.policy_id: rbac_config_pb2.Policy(
                        permissions=[rbac_config_pb2.Permission(any=True)], principals=principals
                    )
                },
            )
        )
    )


def _rate_limit(route_id: str, limit: RateLimit) -> local_rate_limit_pb2.LocalRateLimit:
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
