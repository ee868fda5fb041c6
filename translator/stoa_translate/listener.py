"""The listener `stoa-listener`: one HTTP connection manager, hardened, routes over ADS (RDS, or
Scoped RDS keyed by the path's API segment: `stoa_translate.routes`).

Filter chain: in the order of `stoa_translate.filters.HTTP_FILTER_ORDER` (where each position is
explained), every filter whatever the routes use, off but for the Check and the router until a route
switches it on: a new kind of route changes only routes, so a connection Envoy still serves on an
older listener meets every filter a new route needs.
"""

from __future__ import annotations

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.common.mutation_rules.v3 import mutation_rules_pb2
from envoy.config.core.v3 import (
    address_pb2,
    base_pb2,
    config_source_pb2,
    extension_pb2,
    grpc_service_pb2,
    protocol_pb2,
    substitution_format_string_pb2,
)
from envoy.config.listener.v3 import listener_components_pb2, listener_pb2
from envoy.extensions.access_loggers.grpc.v3 import als_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from envoy.extensions.http.early_header_mutation.header_mutation.v3 import header_mutation_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import message, wrappers_pb2
from stoa_proto import client_headers
from stoa_proto.bodies import CONTENT_TYPE, DENY_BODIES, PROC_BODIES

from stoa_translate import mcp
from stoa_translate.decision import error_contract, jwt_authn, placement
from stoa_translate.filters import (
    BUFFER_FILTER,
    CLAIMS_RBAC_FILTER,
    ENABLED_ON_LISTENER,
    EXT_AUTHZ_FILTER,
    HTTP_FILTER_ORDER,
    JWT_AUTHN_FILTER,
    PROCESSED_BUFFER_FILTER,
    REQUEST_RBAC_FILTER,
    ROUTER_FILTER,
    buffer_filter,
    cel_filter,
    ext_authz_filter,
    packed,
    router_filter,
)
from stoa_translate.ir import SiteIR
from stoa_translate.options import TranslateOptions
from stoa_translate.policies import KINDS
from stoa_translate.routes import ROUTE_CONFIG_NAME, ROUTE_SCOPES_NAME, SCOPE_KEY_HEADER, scoped

LISTENER_NAME = "stoa-listener"
# RFC 5737 documentation address: the only "internal" range, so that no real peer is internal.
NO_CLIENT_ADDRESS = "192.0.2.255"
# Bounded hint given with the 503 when the authorization service is down or too slow.
AUTHZ_UNAVAILABLE_RETRY_AFTER_S = 2
PROC_UNAVAILABLE_RETRY_AFTER_S = 1


def render_listener(site: SiteIR, options: TranslateOptions) -> listener_pb2.Listener:
    by_scope = scoped(site, options)
    manager = hcm.HttpConnectionManager(
        stat_prefix="stoa",
        codec_type=hcm.HttpConnectionManager.AUTO,
        http_filters=[
            hcm.HttpFilter(name=name, typed_config=packed(config), disabled=disabled)
            for name, config, disabled in _chain(site, options)
        ],
        # Before routing and before any filter, on every route whatever its auth mode.
        early_header_mutation_extensions=[_strip_client_headers(options), *_scope_key(by_scope)],
        # Hardening: one canonical path for routing, authorization and the upstream.
        normalize_path=wrappers_pb2.BoolValue(value=True),
        merge_slashes=True,
        path_with_escaped_slashes_action=hcm.HttpConnectionManager.REJECT_REQUEST,
        common_http_protocol_options=protocol_pb2.HttpProtocolOptions(
            headers_with_underscores_action=protocol_pb2.HttpProtocolOptions.REJECT_REQUEST
        ),
        strip_trailing_host_dot=True,
        # The client address is the connection's peer unless hops are explicitly trusted.
        use_remote_address=wrappers_pb2.BoolValue(value=True),
        xff_num_trusted_hops=options.xff_num_trusted_hops,
        # No client is internal, so Envoy strips its x-envoy-* control headers (retry, timeout, ...)
        # and never marks it x-envoy-internal. An empty range list is not enough: Envoy 1.40 then
        # still treats loopback and private peers as internal. The one range named is a TEST-NET
        # address no peer can have.
        internal_address_config=hcm.HttpConnectionManager.InternalAddressConfig(
            unix_sockets=False,
            cidr_ranges=[
                address_pb2.CidrRange(
                    address_prefix=NO_CLIENT_ADDRESS, prefix_len=wrappers_pb2.UInt32Value(value=32)
                )
            ],
        ),
        local_reply_config=_local_replies(site),
        access_log=_decision_log(options),
    )
    if by_scope:
        manager.scoped_routes.CopyFrom(_scoped_routes())
    else:
        manager.rds.CopyFrom(hcm.Rds(route_config_name=ROUTE_CONFIG_NAME, config_source=_ADS))
    return listener_pb2.Listener(
        name=LISTENER_NAME,
        address=address_pb2.Address(
            socket_address=address_pb2.SocketAddress(
                address=options.listener_address, port_value=options.listener_port
            )
        ),
        filter_chains=[
            listener_components_pb2.FilterChain(
                filters=[
                    listener_components_pb2.Filter(
                        name="envoy.filters.network.http_connection_manager", typed_config=packed(manager)
                    )
                ]
            )
        ],
    )


_ADS = config_source_pb2.ConfigSource(
    ads=config_source_pb2.AggregatedConfigSource(), resource_api_version=config_source_pb2.V3
)


def _scoped_routes() -> hcm.ScopedRoutes:
    """Scopes and their route tables over ADS, a request's scope the second segment of the header the
    early mutation writes (`_scope_key`)."""
    fragment = hcm.ScopedRoutes.ScopeKeyBuilder.FragmentBuilder(
        header_value_extractor=hcm.ScopedRoutes.ScopeKeyBuilder.FragmentBuilder.HeaderValueExtractor(
            name=SCOPE_KEY_HEADER, element_separator="/", index=2
        )
    )
    return hcm.ScopedRoutes(
        name=ROUTE_SCOPES_NAME,
        scope_key_builder=hcm.ScopedRoutes.ScopeKeyBuilder(fragments=[fragment]),
        rds_config_source=_ADS,
        scoped_rds=hcm.ScopedRds(scoped_rds_config_source=_ADS),
    )


def _scope_key(by_scope: bool) -> list[extension_pb2.TypedExtensionConfig]:
    """The request's normalised path without its query string, as the header the scope key is read
    from (overwriting whatever the client sent under that name). `:PATH`: the path itself, never the
    x-envoy-original-path a client may send (the default would read that first)."""
    if not by_scope:
        return []
    return [
        extension_pb2.TypedExtensionConfig(
            name="stoa.route_key",
            typed_config=packed(
                header_mutation_pb2.HeaderMutation(
                    mutations=[
                        mutation_rules_pb2.HeaderMutation(
                            append=base_pb2.HeaderValueOption(
                                header=base_pb2.HeaderValue(key=SCOPE_KEY_HEADER, value="%PATH(NQ:PATH)%"),
                                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                            )
                        )
                    ]
                )
            ),
        )
    ]


def _strip_client_headers(options: TranslateOptions) -> extension_pb2.TypedExtensionConfig:
    """Remove what `stoa_proto.client_headers` lists (plus the site's extra names), any letter case."""
    prefixes, names = client_headers.removed(options.extra_identity_headers)
    matchers = [string_pb2.StringMatcher(prefix=p, ignore_case=True) for p in prefixes]
    matchers += [string_pb2.StringMatcher(exact=n, ignore_case=True) for n in names]
    return extension_pb2.TypedExtensionConfig(
        name="stoa.strip_client_headers",
        typed_config=packed(
            header_mutation_pb2.HeaderMutation(
                mutations=[
                    mutation_rules_pb2.HeaderMutation(
                        remove_on_match=mutation_rules_pb2.HeaderMutation.RemoveOnMatch(key_matcher=m)
                    )
                    for m in matchers
                ]
            )
        ),
    )


def _chain(site: SiteIR, options: TranslateOptions) -> list[tuple[str, message.Message, bool]]:
    """(name, config, disabled on the listener) of each filter, in the order table's order."""
    configs: dict[str, message.Message] = {
        EXT_AUTHZ_FILTER: ext_authz_filter(options),
        ROUTER_FILTER: router_filter(),
        BUFFER_FILTER: buffer_filter(),
        PROCESSED_BUFFER_FILTER: buffer_filter(),
        REQUEST_RBAC_FILTER: rbac_pb2.RBAC(),
        JWT_AUTHN_FILTER: jwt_authn.listener_filter(
            site.issuers, placement.envoy_verified_tenants(site, options), options
        ),
        CLAIMS_RBAC_FILTER: rbac_pb2.RBAC(),
    }
    # A position in the order table holds one filter, or a kind's several instances.
    chain: dict[str, list[tuple[str, message.Message, bool]]] = {
        name: [(name, config, name not in ENABLED_ON_LISTENER)] for name, config in configs.items()
    }
    for kind in KINDS.values():
        if not kind.filter_name:
            continue  # decided by the authorization service
        if kind.listener_filters is not None:
            used = [ir for route in site.routes if (ir := route.policy(kind.name)) is not None]
            chain[kind.filter_name] = [(name, config, True) for name, config in kind.filters(used)]
        elif kind.filter_name not in chain:
            chain[kind.filter_name] = [(name, config, True) for name, config in kind.filters(())]
    return [entry for name, _why in HTTP_FILTER_ORDER for entry in chain.get(name, ())]


def _status(status: int) -> accesslog_pb2.AccessLogFilter:
    return accesslog_pb2.AccessLogFilter(
        status_code_filter=accesslog_pb2.StatusCodeFilter(
            comparison=accesslog_pb2.ComparisonFilter(
                op=accesslog_pb2.ComparisonFilter.EQ,
                value=base_pb2.RuntimeUInt32(default_value=status, runtime_key=f"stoa.status_{status}"),
            )
        )
    )


def _status_and_flag(status: int, flag: str) -> accesslog_pb2.AccessLogFilter:
    return accesslog_pb2.AccessLogFilter(
        and_filter=accesslog_pb2.AndFilter(
            filters=[
                _status(status),
                accesslog_pb2.AccessLogFilter(
                    response_flag_filter=accesslog_pb2.ResponseFlagFilter(flags=[flag])
                ),
            ]
        )
    )


def _json_body(status: int) -> dict[str, object]:
    return {
        "body": base_pb2.DataSource(inline_string=DENY_BODIES[status].decode()),
        # Exactly the body bytes, served as JSON (the default local reply is text/plain).
        "body_format_override": substitution_format_string_pb2.SubstitutionFormatString(
            text_format_source=base_pb2.DataSource(inline_string="%LOCAL_REPLY_BODY%"),
            content_type=CONTENT_TYPE,
        ),
    }


def _retry_after(seconds: int) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key="retry-after", value=str(seconds)),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def _processing_replies() -> list[hcm.ResponseMapper]:
    """The processing service's own answers (details `stoa_proc_*`) pass as
    they are; the service unreachable, failing or past its timeout (`ext_proc_error*`, a 503 by
    `status_on_error`) gets the neutral body and Retry-After; a body over Envoy's own buffer (413)
    gets the service's 413 body, so the client sees one contract for the size limit."""
    too_large = {
        "body": base_pb2.DataSource(inline_string=PROC_BODIES["too_large"].decode()),
        "body_format_override": _json_body(403)["body_format_override"],
    }
    return [
        hcm.ResponseMapper(filter=cel_filter("response.code_details.startsWith('stoa_proc_')")),
        hcm.ResponseMapper(
            filter=cel_filter("response.code_details.startsWith('ext_proc')"),
            status_code=wrappers_pb2.UInt32Value(value=503),
            headers_to_add=[_retry_after(PROC_UNAVAILABLE_RETRY_AFTER_S)],
            **_json_body(503),  # type: ignore[arg-type]
        ),
        hcm.ResponseMapper(filter=_status(413), **too_large),  # type: ignore[arg-type]
    ]


def _decision_log(options: TranslateOptions) -> list[accesslog_pb2.AccessLog]:
    """Envoy's own denials, and only those, to the Link, which logs them as decision events."""
    if not options.decision_log_cluster:
        return []
    sink = als_pb2.HttpGrpcAccessLogConfig(
        common_config=als_pb2.CommonGrpcAccessLogConfig(
            log_name="stoa-native-decisions",
            grpc_service=grpc_service_pb2.GrpcService(
                envoy_grpc=grpc_service_pb2.GrpcService.EnvoyGrpc(cluster_name=options.decision_log_cluster)
            ),
            transport_api_version=config_source_pb2.V3,
        )
    )
    return [
        accesslog_pb2.AccessLog(
            name="envoy.access_loggers.http_grpc",
            filter=error_contract.native_denial_filter(),
            typed_config=packed(sink),
        )
    ]


def _local_replies(site: SiteIR) -> hcm.LocalReplyConfig:
    """ext_authz failing (unreachable, timeout, error) is a local 503 flagged UAEX: answer it with the
    neutral body of a 403 (stoa_proto.bodies, shared with the authorization service) and a bounded
    Retry-After. A 503 the service itself returns carries the same neutral body.

    The first matching mapper wins: the authorization service's own 403 and 400 (flagged UAEX) pass
    as they are; any other local 403 — an address denied by rbac, which carries no response flag —
    and any other local 400 — a path with a hidden dot segment, an escaped slash, a header name with
    an underscore — get the same neutral body as the service's instead of Envoy's text.
    """
    return hcm.LocalReplyConfig(
        mappers=[
            # An MCP route's metadata document and 401 challenge (RFC 9728) before anything else.
            *mcp.local_replies(site),
            # Envoy's own decisions first: an rbac claims denial is a local 403 like an address one.
            *error_contract.local_reply_mappers(),
            *_processing_replies(),
            hcm.ResponseMapper(
                filter=_status_and_flag(503, "UAEX"),
                headers_to_add=[
                    base_pb2.HeaderValueOption(
                        header=base_pb2.HeaderValue(
                            key="retry-after", value=str(AUTHZ_UNAVAILABLE_RETRY_AFTER_S)
                        ),
                        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
                    )
                ],
                **_json_body(503),  # type: ignore[arg-type]
            ),
            hcm.ResponseMapper(filter=_status_and_flag(403, "UAEX")),
            hcm.ResponseMapper(filter=_status(403), **_json_body(403)),  # type: ignore[arg-type]
            hcm.ResponseMapper(filter=_status_and_flag(400, "UAEX")),
            hcm.ResponseMapper(filter=_status(400), **_json_body(400)),  # type: ignore[arg-type]
        ]
    )
