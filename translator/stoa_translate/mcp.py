"""MCP routes at the gateway, as the MCP authorization specification asks (RFC 9728 and RFC 6750):

- `/.well-known/oauth-protected-resource<route path>` at the gateway's root, unauthenticated, answered
  by Envoy itself: the resource (the MCP endpoint's URL as the client reached it), the authorization
  servers (the tenant's trusted issuers), the scopes the route requires;
- an unauthenticated or refused request on the MCP route answers 401 with
  `WWW-Authenticate: Bearer resource_metadata="<that URL>"` (and `error="invalid_token"` when a token
  was sent, as the gateway's error contract says): a per-route variant of the contract, applied to
  the answer of whichever layer refused (a local reply), so clients can discover how to authenticate.
"""

from __future__ import annotations

from envoy.config.core.v3 import base_pb2, substitution_format_string_pb2
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from envoy.type.matcher.v3 import string_pb2
from google.protobuf import struct_pb2

from stoa_translate.filters import EXT_AUTHZ_DISABLED, EXT_AUTHZ_FILTER, cel_filter, packed
from stoa_translate.ir import MCP_KIND, RouteIR, SiteIR

WELL_KNOWN = "/.well-known/oauth-protected-resource"
# The URL the client reached, as Envoy saw it (the listener trusts no client's forwarding headers).
_ORIGIN = "%REQ(:SCHEME)%://%REQ(:AUTHORITY)%"


def metadata_path(route: RouteIR) -> str:
    return WELL_KNOWN + ("" if route.path_prefix == "/" else route.path_prefix)


def _entry_name(route: RouteIR) -> str:
    return f"{route.route_id}:resource-metadata"


def well_known_entries(site: SiteIR) -> list[route_components_pb2.Route]:
    """One unauthenticated entry per MCP route, answered by Envoy (its body set by `local_replies`)."""
    entries = []
    for route in site.routes:
        if route.kind != MCP_KIND:
            continue
        entry = route_components_pb2.Route(
            name=_entry_name(route),
            match=route_components_pb2.RouteMatch(
                path=metadata_path(route),
                headers=[
                    route_components_pb2.HeaderMatcher(
                        name=":method",
                        string_match=string_pb2.StringMatcher(safe_regex={"regex": "GET|HEAD"}),
                    )
                ],
            ),
            direct_response=route_components_pb2.DirectResponseAction(status=200),
        )
        entry.typed_per_filter_config[EXT_AUTHZ_FILTER].CopyFrom(packed(EXT_AUTHZ_DISABLED))
        entries.append(entry)
    return entries


def _document(site: SiteIR, route: RouteIR) -> struct_pb2.Struct:
    document = struct_pb2.Struct()
    document.update(
        {
            "resource": _ORIGIN + ("" if route.path_prefix == "/" else route.path_prefix),
            "authorization_servers": sorted(i.issuer for i in site.issuers if i.tenant_id == route.tenant_id),
            "bearer_methods_supported": ["header"],
            "scopes_supported": list(route.scopes),
            "resource_name": route.api_id,
        }
    )
    return document


def _challenge(value: str) -> base_pb2.HeaderValueOption:
    return base_pb2.HeaderValueOption(
        header=base_pb2.HeaderValue(key="www-authenticate", value=value),
        append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
    )


def local_replies(site: SiteIR) -> list[hcm.ResponseMapper]:
    """The MCP routes' mappers (placed before every other: the first match wins)."""
    mappers = []
    for route in site.routes:
        if route.kind != MCP_KIND:
            continue
        mappers.append(
            hcm.ResponseMapper(
                filter=cel_filter(f"xds.route_name == '{_entry_name(route)}'"),
                body_format_override=substitution_format_string_pb2.SubstitutionFormatString(
                    json_format=_document(site, route), content_type="application/json"
                ),
            )
        )
        where = f'resource_metadata="{_ORIGIN}{metadata_path(route)}"'
        on_route = f"response.code == 401 && xds.route_name.startsWith('{route.route_id}:')"
        mappers.append(
            hcm.ResponseMapper(
                filter=cel_filter(f"{on_route} && 'authorization' in request.headers"),
                headers_to_add=[_challenge(f'Bearer error="invalid_token", {where}')],
            )
        )
        mappers.append(
            hcm.ResponseMapper(filter=cel_filter(on_route), headers_to_add=[_challenge(f"Bearer {where}")])
        )
    return mappers
