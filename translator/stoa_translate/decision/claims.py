"""What the authorization service checks after the signature, as `rbac` rules Envoy evaluates:
on the request's form before the token is read, and on `jwt_authn`'s verified payload after.

Each rule is a DENY policy whose name says why (`error_contract` maps the name to the reason, the
status and the challenge). The claims policies exclude one another, so whichever Envoy evaluates
first, a request is denied for the reason the service would give, in the service's order: the token
itself (`iss` present, `sub` present and fit for a header by `stoa_proto.decisions.HEADER_CLAIM`, no
critical header extension, an issuer and key the tenant trusts now), then the tenant claim, then
every required scope.

Scopes come from `scope` (space-separated) or `scp` (a list, or space-separated). A `safe_regex`
string match is a full match, so a scope inside a space-separated claim is `(.* )?scope( .*)?`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

from envoy.config.rbac.v3 import rbac_pb2 as rbac_config
from envoy.config.route.v3 import route_components_pb2
from envoy.extensions.filters.http.rbac.v3 import rbac_pb2
from envoy.type.matcher.v3 import metadata_pb2, regex_pb2, string_pb2, value_pb2
from stoa_proto.decisions import HEADER_CLAIM, Reason

from stoa_translate.decision import error_contract, jwt_authn
from stoa_translate.filters import JWT_AUTHN_FILTER

if TYPE_CHECKING:
    from stoa_translate.ir import RouteIR
    from stoa_translate.options import TranslateOptions

# Headers that may not appear twice (Envoy joins repeated values with ","; the service refuses a
# comma in them for the same reason).
SINGLE_VALUED = ("authorization", "x-api-key")


def _principal(**kwargs: object) -> rbac_config.Principal:
    return rbac_config.Principal(**kwargs)  # type: ignore[arg-type]


def _all(ids: Iterable[rbac_config.Principal]) -> rbac_config.Principal:
    return _principal(and_ids=rbac_config.Principal.Set(ids=list(ids)))


def _any(ids: Iterable[rbac_config.Principal]) -> rbac_config.Principal:
    return _principal(or_ids=rbac_config.Principal.Set(ids=list(ids)))


def _not(principal: rbac_config.Principal) -> rbac_config.Principal:
    return _principal(not_id=principal)


def _verified(key: str, path: tuple[str, ...], value: value_pb2.ValueMatcher) -> rbac_config.Principal:
    return _principal(
        sourced_metadata=rbac_config.SourcedMetadata(
            metadata_source=rbac_config.DYNAMIC,
            metadata_matcher=metadata_pb2.MetadataMatcher(
                filter=JWT_AUTHN_FILTER,
                path=[metadata_pb2.MetadataMatcher.PathSegment(key=k) for k in (key, *path)],
                value=value,
            ),
        )
    )


def _claim(*path: str, value: value_pb2.ValueMatcher) -> rbac_config.Principal:
    return _verified(jwt_authn.PAYLOAD, path, value)


def _string(**kwargs: object) -> value_pb2.ValueMatcher:
    return value_pb2.ValueMatcher(string_match=string_pb2.StringMatcher(**kwargs))  # type: ignore[arg-type]


def _regex(pattern: str) -> value_pb2.ValueMatcher:
    return _string(safe_regex=regex_pb2.RegexMatcher(regex=pattern))


_PRESENT = value_pb2.ValueMatcher(present_match=True)


def _scope(scope: str) -> rbac_config.Principal:
    within = f"(.* )?{re.escape(scope)}( .*)?"
    return _any(
        (
            _claim("scope", value=_regex(within)),
            _claim(
                "scp",
                value=value_pb2.ValueMatcher(list_match=value_pb2.ListMatcher(one_of=_string(exact=scope))),
            ),
            _claim("scp", value=_regex(within)),
        )
    )


def _deny(policies: dict[str, rbac_config.Principal]) -> rbac_pb2.RBACPerRoute:
    return rbac_pb2.RBACPerRoute(
        rbac=rbac_pb2.RBAC(
            rules=rbac_config.RBAC(
                action=rbac_config.RBAC.DENY,
                policies={
                    name: rbac_config.Policy(
                        permissions=[rbac_config.Permission(any=True)], principals=[principal]
                    )
                    for name, principal in policies.items()
                },
            )
        )
    )


def request_config() -> rbac_pb2.RBACPerRoute:
    """A request naming a single-valued header twice is malformed, before any token is read."""
    repeated = _any(
        _principal(
            header=route_components_pb2.HeaderMatcher(
                name=name, string_match=string_pb2.StringMatcher(contains=",")
            )
        )
        for name in SINGLE_VALUED
    )
    return _deny({error_contract.POLICIES[Reason.MALFORMED_REQUEST]: repeated})


def _trusted(route: RouteIR) -> rbac_config.Principal:
    """The token's issuer is one of the tenant's issuers now, and the key id it names (if any) one of
    that issuer's keys now. jwt_authn verified it with the keys of the listener that accepted the
    connection, which may be older than the last change of the tenant's issuers: a removed issuer or
    key is refused here all the same (a token naming no key id cannot be told apart by its key)."""
    if not route.trust:
        return _claim("iss", value=_PRESENT)
    kid = ("kid",)

    def issuer(iss: str, kids: tuple[str, ...]) -> rbac_config.Principal:
        named = _claim("iss", value=_string(exact=iss))
        if not kids:
            return named
        key = _any(
            (
                _not(_verified(jwt_authn.HEADER, kid, _PRESENT)),
                *(_verified(jwt_authn.HEADER, kid, _string(exact=k)) for k in kids),
            )
        )
        return _all((named, key))

    return _any(issuer(iss, kids) for iss, kids in route.trust)


def trust_config(route: RouteIR) -> rbac_pb2.RBACPerRoute:
    """For a route whose token jwt_authn verifies and the service decides: the issuer and key rule
    alone (the service decides the rest)."""
    return _deny({error_contract.POLICIES[Reason.INVALID_TOKEN]: _not(_trusted(route))})


def claims_config(route: RouteIR, options: TranslateOptions) -> rbac_pb2.RBACPerRoute:
    token_ok = _all(
        (
            _trusted(route),
            _claim("sub", value=_regex(HEADER_CLAIM)),
            _not(_verified(jwt_authn.HEADER, ("crit",), _PRESENT)),
        )
    )
    tenant_ok = _claim(options.tenant_claim, value=_string(exact=route.tenant_id))
    # Envoy evaluates every DENY policy of an allowed request, each `and_ids` up to its first
    # mismatch: the condition an allowed request fails stands first, so the token's rules run once
    # per request instead of once per policy (bench/PROFILE-native.md). The order changes no outcome.
    policies = {
        error_contract.POLICIES[Reason.INVALID_TOKEN]: _not(token_ok),
        error_contract.POLICIES[Reason.TENANT_MISMATCH]: _all((_not(tenant_ok), token_ok)),
    }
    scopes = sorted(set(route.scopes) | set(options.required_scopes))
    if scopes:
        policies[error_contract.POLICIES[Reason.INSUFFICIENT_SCOPE]] = _all(
            (_not(_all(_scope(s) for s in scopes)), tenant_ok, token_ok)
        )
    return _deny(policies)
