"""The token, checked by Envoy's `jwt_authn` as the authorization service checks it.

One provider per trusted issuer of each tenant with a route whose token Envoy verifies, one
requirement per such tenant (any of its issuers); a route names its tenant's requirement. The rules
both verifiers share come from `stoa_proto.decisions`: the `Bearer` spellings (from the
`authorization` header only: no query parameter, no cookie), the clock skew; `exp` required, the
site's audience and maximum lifetime. The verified payload (and
header) go to dynamic metadata for the claims rules and, on service routes, the Check; `sub`
becomes the subject header.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.jwt_authn.v3 import config_pb2 as jwt
from google.protobuf import duration_pb2
from stoa_proto.decisions import BEARER_SCHEMES, CLOCK_SKEW_S, SUBJECT_HEADER

if TYPE_CHECKING:
    from stoa_translate.ir import IssuerIR, RouteIR
    from stoa_translate.options import TranslateOptions

# Dynamic-metadata keys under the filter's namespace (the authorization service reads PAYLOAD).
PAYLOAD = "payload"
HEADER = "header"
# How many verified tokens Envoy keeps (per worker thread).
CACHE_SIZE = 10_000


def _provider(issuer: IssuerIR, options: TranslateOptions) -> jwt.JwtProvider:
    return jwt.JwtProvider(
        issuer=issuer.issuer,
        audiences=[options.audience],
        local_jwks=base_pb2.DataSource(inline_string=issuer.jwks_json),
        # Kept for the route, which removes it before the upstream unless the API forwards it (the
        # same rule whichever placement decides).
        forward=True,
        from_headers=[jwt.JwtHeader(name="authorization", value_prefix=f"{s} ") for s in BEARER_SCHEMES],
        payload_in_metadata=PAYLOAD,
        header_in_metadata=HEADER,
        clock_skew_seconds=CLOCK_SKEW_S,
        require_expiration=True,
        max_lifetime=duration_pb2.Duration(seconds=options.max_token_lifetime_s),
        jwt_cache_config=jwt.JwtCacheConfig(jwt_cache_size=CACHE_SIZE),
        claim_to_headers=[jwt.JwtClaimToHeader(header_name=SUBJECT_HEADER, claim_name="sub")],
    )


def listener_filter(
    issuers: Iterable[IssuerIR], tenants: Iterable[str], options: TranslateOptions
) -> jwt.JwtAuthentication:
    """Providers and requirements for `tenants` (those whose tokens Envoy verifies; none: the filter
    is on the listener all the same, and a route naming a tenant it lacks is refused)."""
    wanted = set(tenants)
    config = jwt.JwtAuthentication()
    names: dict[str, list[str]] = {}
    for issuer in issuers:
        if issuer.tenant_id not in wanted:
            continue
        own = names.setdefault(issuer.tenant_id, [])
        # '#' is not allowed in a tenant id: provider names never collide.
        name = f"{issuer.tenant_id}#{len(own)}"
        own.append(name)
        config.providers[name].CopyFrom(_provider(issuer, options))
    for tenant, providers in names.items():
        requirement = config.requirement_map[tenant]
        if len(providers) == 1:
            requirement.provider_name = providers[0]
        else:
            requirement.requires_any.requirements.extend(
                jwt.JwtRequirement(provider_name=p) for p in providers
            )
    return config


def route_config(route: RouteIR) -> jwt.PerRouteConfig:
    """Switches the filter on for the route, with its tenant's requirement."""
    return jwt.PerRouteConfig(requirement_name=route.tenant_id)
