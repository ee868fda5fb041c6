"""The listener's HTTP filters: their names, their one order, and the configs no policy kind owns.

Filter names are shared by the listener (the chain) and the routes (typed_per_filter_config keys), so
both take them from here. Policy kinds (`stoa_translate.policies`) say which filter they switch on;
this module says where in the chain each filter stands, and why.
"""

from __future__ import annotations

from envoy.config.core.v3 import config_source_pb2, grpc_service_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.type.v3 import http_status_pb2
from google.protobuf import any_pb2, duration_pb2, message

from stoa_translate.options import TranslateOptions

CORS_FILTER = "envoy.filters.http.cors"
RBAC_FILTER = "envoy.filters.http.rbac"
EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
RATE_LIMIT_FILTER = "envoy.filters.http.local_ratelimit"
ROUTER_FILTER = "envoy.filters.http.router"

EXT_AUTHZ_CLUSTER = "stoa-ext-authz"

# THE order of the chain: a filter is listed once, here, with the reason for its position. A filter
# a policy kind owns is on the listener only when some route uses that kind; the others always are.
# Before all of them, outside the chain, the connection manager's early header mutation strips the
# client headers no upstream may receive (`listener.py`): no filter ever sees them.
HTTP_FILTER_ORDER: tuple[tuple[str, str], ...] = (
    (CORS_FILTER, "first: a genuine preflight is answered by Envoy itself, before any check runs"),
    (RBAC_FILTER, "address rules before the Check: an address-denied request costs no authorization call"),
    (EXT_AUTHZ_FILTER, "the authorization service decides every request that gets this far"),
    (RATE_LIMIT_FILTER, "after the Check: only authorized requests spend the route's tokens"),
    (ROUTER_FILTER, "last: forwards to the upstream"),
)
ALWAYS_PRESENT = (EXT_AUTHZ_FILTER, ROUTER_FILTER)


def packed(config: object) -> any_pb2.Any:
    wrapped = any_pb2.Any()
    wrapped.Pack(config)  # type: ignore[arg-type]
    return wrapped


def ext_authz_filter(options: TranslateOptions) -> ext_authz_pb2.ExtAuthz:
    timeout = duration_pb2.Duration()
    timeout.FromMilliseconds(options.ext_authz_timeout_ms)
    return ext_authz_pb2.ExtAuthz(
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=EXT_AUTHZ_CLUSTER),
            timeout=timeout,
        ),
        transport_api_version=config_source_pb2.V3,
        failure_mode_allow=False,
        status_on_error=http_status_pb2.HttpStatus(code=http_status_pb2.ServiceUnavailable),
        include_peer_certificate=False,
    )


def router_filter() -> message.Message:
    # No x-envoy-* headers added by Envoy (x-envoy-original-path included); no retry policy anywhere.
    return router_pb2.Router(suppress_envoy_headers=True)


def ext_authz_route(tenant_id: str, api_id: str, route_id: str) -> ext_authz_pb2.ExtAuthzPerRoute:
    return ext_authz_pb2.ExtAuthzPerRoute(
        check_settings=ext_authz_pb2.CheckSettings(
            context_extensions={"tenant_id": tenant_id, "api_id": api_id, "route_id": route_id}
        )
    )


def no_ext_authz_route() -> ext_authz_pb2.ExtAuthzPerRoute:
    """For an entry Envoy answers itself (a refusal): nothing to decide."""
    return ext_authz_pb2.ExtAuthzPerRoute(disabled=True)


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
