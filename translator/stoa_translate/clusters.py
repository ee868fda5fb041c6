"""Clusters: one per backend identity (scheme, host, port), plus the authorization service's, the
processing service's (and the MCP module's when a route is an MCP route).

A cluster is named by its identity, never by a route's position, so editing one route never renames
(and so never drains) another route's cluster.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping

from envoy.config.cluster.v3 import cluster_pb2
from envoy.config.core.v3 import address_pb2, base_pb2, protocol_pb2
from envoy.config.endpoint.v3 import endpoint_components_pb2, endpoint_pb2
from envoy.extensions.transport_sockets.tls.v3 import common_pb2, tls_pb2
from envoy.extensions.upstreams.http.v3 import http_protocol_options_pb2
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import duration_pb2

from stoa_translate.filters import EXT_AUTHZ_CLUSTER, EXT_PROC_CLUSTER, packed
from stoa_translate.ir import MCP_KIND, MCP_MODULE_CLUSTER, Backend, SiteIR
from stoa_translate.options import TranslateOptions

SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CONNECT_TIMEOUT = duration_pb2.Duration(seconds=5)
_HTTP_PROTOCOL_OPTIONS = "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"


def render_clusters(
    site: SiteIR, options: TranslateOptions, backends: Mapping[str, Backend] | None = None
) -> list[cluster_pb2.Cluster]:
    """`backends`: the routes' backends by cluster name, when the caller keeps them."""
    if backends is None:
        backends = {r.backend.cluster_name: r.backend for r in site.routes if r.kind != MCP_KIND}
    clusters = backend_clusters(backends)
    if site.needs_mcp():
        host, port = options.mcp_endpoint()
        clusters.append(_cluster(MCP_MODULE_CLUSTER, host, port, _is_ip(host)))
    clusters.append(_grpc_service(EXT_AUTHZ_CLUSTER, *options.ext_authz_endpoint()))
    # The listener's processing filter names it whether or not a route uses the service yet.
    clusters.append(_grpc_service(EXT_PROC_CLUSTER, *options.ext_proc_endpoint()))
    return clusters


def backend_clusters(backends: Mapping[str, Backend]) -> list[cluster_pb2.Cluster]:
    """One cluster per backend, by cluster name."""
    return [_backend(backends[name]) for name in sorted(backends)]


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _cluster(name: str, host: str, port: int, is_ip: bool) -> cluster_pb2.Cluster:
    return cluster_pb2.Cluster(
        name=name,
        type=cluster_pb2.Cluster.STATIC if is_ip else cluster_pb2.Cluster.STRICT_DNS,
        connect_timeout=CONNECT_TIMEOUT,
        load_assignment=endpoint_pb2.ClusterLoadAssignment(
            cluster_name=name,
            endpoints=[
                endpoint_components_pb2.LocalityLbEndpoints(
                    lb_endpoints=[
                        endpoint_components_pb2.LbEndpoint(
                            endpoint=endpoint_components_pb2.Endpoint(
                                address=address_pb2.Address(
                                    socket_address=address_pb2.SocketAddress(address=host, port_value=port)
                                )
                            )
                        )
                    ]
                )
            ],
        ),
    )


# A backend's cluster is built once (10,000 of them took a visible part of a 1-route translation);
# snapshots share the message, which nothing mutates once rendered.
@functools.lru_cache(maxsize=65_536)
def _backend(backend: Backend) -> cluster_pb2.Cluster:
    cluster = _cluster(backend.cluster_name, backend.host, backend.port, backend.is_ip)
    if backend.scheme == "https":
        cluster.transport_socket.name = "envoy.transport_sockets.tls"
        cluster.transport_socket.typed_config.CopyFrom(packed(_upstream_tls(backend)))
    return cluster


def _upstream_tls(backend: Backend) -> tls_pb2.UpstreamTlsContext:
    # The upstream's certificate must chain to the system CAs and name the host we dialled.
    san_type = (
        common_pb2.SubjectAltNameMatcher.IP_ADDRESS if backend.is_ip else common_pb2.SubjectAltNameMatcher.DNS
    )
    context = tls_pb2.UpstreamTlsContext(
        common_tls_context=tls_pb2.CommonTlsContext(
            validation_context=common_pb2.CertificateValidationContext(
                trusted_ca=base_pb2.DataSource(filename=SYSTEM_CA_BUNDLE),
                match_typed_subject_alt_names=[
                    common_pb2.SubjectAltNameMatcher(
                        san_type=san_type, matcher=string_pb2.StringMatcher(exact=backend.host)
                    )
                ],
            )
        )
    )
    if not backend.is_ip:  # SNI carries host names only (RFC 6066)
        context.sni = backend.host
    return context


def _grpc_service(name: str, host: str, port: int) -> cluster_pb2.Cluster:
    cluster = _cluster(name, host, port, _is_ip(host))
    # gRPC needs HTTP/2 end to end.
    cluster.typed_extension_protocol_options[_HTTP_PROTOCOL_OPTIONS].CopyFrom(
        packed(
            http_protocol_options_pb2.HttpProtocolOptions(
                explicit_http_config=http_protocol_options_pb2.HttpProtocolOptions.ExplicitHttpConfig(
                    http2_protocol_options=protocol_pb2.Http2ProtocolOptions()
                )
            )
        )
    )
    return cluster
