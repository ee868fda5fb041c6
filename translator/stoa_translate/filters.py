"""The listener's HTTP filters: their names, their one order, and the configs no policy kind owns.

Filter names are shared by the listener (the chain) and the routes (typed_per_filter_config keys), so
both take them from here. Policy kinds (`stoa_translate.policies`) say which filter they switch on;
this module says where in the chain each filter stands, and why.
"""

from __future__ import annotations

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import base_pb2, config_source_pb2, grpc_service_pb2
from envoy.extensions.access_loggers.filters.cel.v3 import cel_pb2
from envoy.extensions.filters.http.buffer.v3 import buffer_pb2
from envoy.extensions.filters.http.ext_authz.v3 import ext_authz_pb2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.extensions.filters.http.router.v3 import router_pb2
from envoy.type.v3 import http_status_pb2
from google.protobuf import any_pb2, duration_pb2, message, wrappers_pb2
from stoa_proto.processing import REQUEST_ATTRIBUTES, ROUTE_METADATA, VERSION_METADATA

from stoa_translate.options import TranslateOptions

CORS_FILTER = "envoy.filters.http.cors"
RBAC_FILTER = "envoy.filters.http.rbac"
EXT_AUTHZ_FILTER = "envoy.filters.http.ext_authz"
BUFFER_FILTER = "envoy.filters.http.buffer"
# A second buffer instance, after the processor, on routes that skip the request-headers message.
PROCESSED_BUFFER_FILTER = "stoa.buffer.processed"
RATE_LIMIT_FILTER = "envoy.filters.http.local_ratelimit"
EXT_PROC_FILTER = "envoy.filters.http.ext_proc"
# The position of the compressor instances (each named by the compression kind).
COMPRESSOR_FILTER = "envoy.filters.http.compressor"
ROUTER_FILTER = "envoy.filters.http.router"
JWT_AUTHN_FILTER = "envoy.filters.http.jwt_authn"
# Two more instances of the rbac filter, each its own name in the chain and its own per-route key:
# the request's form, and the verified token's claims (`stoa_translate.decision.claims`).
REQUEST_RBAC_FILTER = "stoa.rbac.request"
CLAIMS_RBAC_FILTER = "stoa.rbac.claims"

EXT_AUTHZ_CLUSTER = "stoa-ext-authz"
EXT_PROC_CLUSTER = "stoa-ext-proc"
# Bound on each message the processing service answers (a buffered body is one message).
EXT_PROC_MESSAGE_TIMEOUT_MS = 2000

# THE order of the chain: a filter is listed once, here, with the reason for its position. Every
# filter is on the listener from the first publication, whatever the routes use (the compressor's
# instances aside: one per setting, and no request is refused for want of one), and all but the Check
# and the router (`ENABLED_ON_LISTENER`) are off there, switched on by the routes that need them.
# So a route never needs a filter that an older listener lacks: Envoy keeps serving a connection on
# the listener that accepted it until that listener has drained, with the route tables already new.
# Before all of them, outside the chain, the connection manager's early header mutation strips the
# client headers no upstream may receive (`listener.py`): no filter ever sees them.
HTTP_FILTER_ORDER: tuple[tuple[str, str], ...] = (
    (CORS_FILTER, "first: a genuine preflight is answered by Envoy itself, before any check runs"),
    (RBAC_FILTER, "address rules before the Check: an address-denied request costs no authorization call"),
    (
        BUFFER_FILTER,
        "before the Check, on routes whose request body is inspected: the body is complete, or refused "
        "413, before a filter holds the headers waiting on a call (with ext_authz holding them, a body "
        "past Envoy's buffer limit stalls instead of getting 413)",
    ),
    (
        REQUEST_RBAC_FILTER,
        "before the token is read: a repeated credential is a malformed request (400), as the service says",
    ),
    (JWT_AUTHN_FILTER, "the token, after the address rules and before anything reads its claims"),
    (
        CLAIMS_RBAC_FILTER,
        "tenant and scopes on the payload jwt_authn verified: a route Envoy decides ends here, no Check",
    ),
    (
        EXT_AUTHZ_FILTER,
        "the authorization service decides every route Envoy does not (disabled on the routes it does)",
    ),
    (RATE_LIMIT_FILTER, "after the Check: only authorized requests spend the route's tokens"),
    (
        COMPRESSOR_FILTER,
        "before the processor: a response passes the filters in reverse, so the processor inspects "
        "(and redacts) the plain body and the compressor compresses what it passed",
    ),
    (
        EXT_PROC_FILTER,
        "after the Check and the bucket: a body is read and inspected only for a request that may pass",
    ),
    (
        PROCESSED_BUFFER_FILTER,
        "after the processor, on routes that skip the request-headers message (the processor then "
        "lets the headers through at once): holds them until the processor has let the body through, "
        "so the upstream gets nothing of a refused request, and sets content-length again (Envoy "
        "drops it on such a route)",
    ),
    (ROUTER_FILTER, "last: forwards to the upstream"),
)
# On for every route: the Check (a route Envoy decides turns it off for itself) and the router.
ENABLED_ON_LISTENER = (EXT_AUTHZ_FILTER, ROUTER_FILTER)
# A route's inspected request body when its policy names no limit (the processing service's default).
PROC_DEFAULT_MAX_BODY_BYTES = 1024 * 1024


def cel_filter(expression: str) -> accesslog_pb2.AccessLogFilter:
    """Selects responses (a local-reply mapper's or an access log's) by a CEL expression."""
    return accesslog_pb2.AccessLogFilter(
        extension_filter=accesslog_pb2.ExtensionFilter(
            name="envoy.access_loggers.extension_filters.cel",
            typed_config=packed(cel_pb2.ExpressionFilter(expression=expression)),
        )
    )


def packed(config: object) -> any_pb2.Any:
    wrapped = any_pb2.Any()
    # Deterministic: the packed bytes (map entries included) are part of the content version, which
    # must not depend on the process that rendered them (the Link, the CP preview).
    wrapped.Pack(config, deterministic=True)  # type: ignore[arg-type]
    return wrapped


def ext_authz_filter(options: TranslateOptions) -> ext_authz_pb2.ExtAuthz:
    """The Check carries the payload jwt_authn verified, when it did (the filter's own namespace
    only), for the routes whose token Envoy verifies and the service decides."""
    timeout = duration_pb2.Duration()
    timeout.FromMilliseconds(options.ext_authz_timeout_ms)
    return ext_authz_pb2.ExtAuthz(
        metadata_context_namespaces=[JWT_AUTHN_FILTER],
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=EXT_AUTHZ_CLUSTER),
            timeout=timeout,
        ),
        transport_api_version=config_source_pb2.V3,
        failure_mode_allow=False,
        status_on_error=http_status_pb2.HttpStatus(code=http_status_pb2.ServiceUnavailable),
        include_peer_certificate=False,
    )


def ext_proc_filter() -> ext_proc_pb2.ExternalProcessor:
    """Off on the listener, and inert where on (every phase skipped, so no stream is opened): a
    route's per-route config switches it on with the phases its body policies need (the virtual
    host's stream metadata switches it on, inert, for the other routes of its table). Failing closed:
    the service unreachable, failing or past its timeout is a 503 (the local replies give it the
    neutral body and Retry-After).

    The request attributes are the listener's (Envoy 1.40 ignores a route's own list): on a route
    that skips the request-headers message they are what the service learns of the request's
    headers (`stoa_proto.processing`)."""
    timeout = duration_pb2.Duration()
    timeout.FromMilliseconds(EXT_PROC_MESSAGE_TIMEOUT_MS)
    return ext_proc_pb2.ExternalProcessor(
        grpc_service=grpc_service_pb2.GrpcService(
            envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=EXT_PROC_CLUSTER)
        ),
        failure_mode_allow=False,
        processing_mode=ProcessingMode(
            request_header_mode=ProcessingMode.SKIP,
            response_header_mode=ProcessingMode.SKIP,
            request_trailer_mode=ProcessingMode.SKIP,
            response_trailer_mode=ProcessingMode.SKIP,
        ),
        request_attributes=REQUEST_ATTRIBUTES,
        message_timeout=timeout,
        # The service switches a server-sent event stream to streamed mode at the response headers.
        allow_mode_override=True,
        status_on_error=http_status_pb2.HttpStatus(code=http_status_pb2.ServiceUnavailable),
        stat_prefix="stoa",
    )


def ext_proc_route(
    route_id: str, *, request_headers: bool, request_body: bool, response_headers: bool, response_body: bool
) -> ext_proc_pb2.ExtProcPerRoute:
    """A processing kind's per-route config: the phases it needs (bodies buffered whole, trailers
    never) and the route's id for the service. The policy-set version is added on the virtual host
    (Envoy merges the two levels' metadata)."""
    return ext_proc_pb2.ExtProcPerRoute(
        overrides=ext_proc_pb2.ExtProcOverrides(
            processing_mode=ProcessingMode(
                request_header_mode=ProcessingMode.SEND if request_headers else ProcessingMode.SKIP,
                request_body_mode=ProcessingMode.BUFFERED if request_body else ProcessingMode.NONE,
                response_header_mode=ProcessingMode.SEND if response_headers else ProcessingMode.SKIP,
                response_body_mode=ProcessingMode.BUFFERED if response_body else ProcessingMode.NONE,
                request_trailer_mode=ProcessingMode.SKIP,
                response_trailer_mode=ProcessingMode.SKIP,
            ),
            grpc_initial_metadata=[base_pb2.HeaderValue(key=ROUTE_METADATA, value=route_id)],
        )
    )


# How much of a message each mode sends, least first: merging two kinds' modes keeps the larger.
_HEADER_RANK = {ProcessingMode.SKIP: 0, ProcessingMode.DEFAULT: 1, ProcessingMode.SEND: 2}
_BODY_RANK = {ProcessingMode.NONE: 0, ProcessingMode.STREAMED: 1, ProcessingMode.BUFFERED: 2}


def merge_ext_proc_routes(a: message.Message, b: message.Message) -> ext_proc_pb2.ExtProcPerRoute:
    """Two processing kinds on one route: one per-route config whose every phase is the larger of
    the two (a phase one kind needs is never skipped for the other); same route metadata."""
    if not isinstance(a, ext_proc_pb2.ExtProcPerRoute) or not isinstance(b, ext_proc_pb2.ExtProcPerRoute):
        raise TypeError("only processing kinds share a filter")
    merged = ext_proc_pb2.ExtProcPerRoute()
    merged.CopyFrom(a)
    mode, other = merged.overrides.processing_mode, b.overrides.processing_mode
    for name, rank in (
        ("request_header_mode", _HEADER_RANK),
        ("response_header_mode", _HEADER_RANK),
        ("request_trailer_mode", _HEADER_RANK),
        ("response_trailer_mode", _HEADER_RANK),
        ("request_body_mode", _BODY_RANK),
        ("response_body_mode", _BODY_RANK),
    ):
        if rank[getattr(other, name)] > rank[getattr(mode, name)]:
            setattr(mode, name, getattr(other, name))
    return merged


def buffer_filter() -> buffer_pb2.Buffer:
    return buffer_pb2.Buffer(max_request_bytes=wrappers_pb2.UInt32Value(value=PROC_DEFAULT_MAX_BODY_BYTES))


def buffer_route(max_request_bytes: int) -> buffer_pb2.BufferPerRoute:
    return buffer_pb2.BufferPerRoute(
        buffer=buffer_pb2.Buffer(
            max_request_bytes=wrappers_pb2.UInt32Value(value=max_request_bytes or PROC_DEFAULT_MAX_BODY_BYTES)
        )
    )


def router_filter() -> message.Message:
    # No x-envoy-* headers added by Envoy (x-envoy-original-path included); no retry policy anywhere.
    return router_pb2.Router(suppress_envoy_headers=True)


# For an entry Envoy answers itself (a refusal) or decides itself: no Check.
EXT_AUTHZ_DISABLED = ext_authz_pb2.ExtAuthzPerRoute(disabled=True)


def ext_authz_route(
    tenant_id: str, api_id: str, route_id: str, route_version: str
) -> ext_authz_pb2.ExtAuthzPerRoute:
    """The Check's context: the route, and the version of its entry in the authorization policy set
    (`stoa_translate.policy_set.route_version`), so the service decides it with a set holding the
    route as this entry was built, and no other route's change ever touches this entry."""
    return ext_authz_pb2.ExtAuthzPerRoute(
        check_settings=ext_authz_pb2.CheckSettings(
            context_extensions={
                "tenant_id": tenant_id,
                "api_id": api_id,
                "route_id": route_id,
                "route_version": route_version,
            }
        )
    )


def virtual_host_configs(proc_version: str | None) -> dict[str, any_pb2.Any]:
    """typed_per_filter_config of the virtual host: what every route shares. The processing
    service's stream metadata names the processing policy set (in a table where a route uses it);
    Envoy merges it into each route's own."""
    configs = {}
    if proc_version is not None:
        configs[EXT_PROC_FILTER] = packed(
            ext_proc_pb2.ExtProcPerRoute(
                overrides=ext_proc_pb2.ExtProcOverrides(
                    grpc_initial_metadata=[base_pb2.HeaderValue(key=VERSION_METADATA, value=proc_version)]
                )
            )
        )
    return configs
