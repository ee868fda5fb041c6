"""One error contract whatever the placement: Envoy's own denials answered as the authorization
service answers them, and the decision reason each one stands for.

Left to themselves, `jwt_authn` and `rbac` answer with their own text, a wrong audience is 403 and the
`WWW-Authenticate` realm echoes the request URL. Local-reply mappers, selected by the response code
details Envoy records for the denial, replace all of that with the service's status, challenge and
neutral body (`stoa_proto.decisions`, `stoa_proto.bodies`). The same table gives the Link the reason
of each native denial it reads from Envoy's access log, so both placements log one closed set.
"""

from __future__ import annotations

from envoy.config.accesslog.v3 import accesslog_pb2
from envoy.config.core.v3 import base_pb2, substitution_format_string_pb2
from envoy.extensions.filters.network.http_connection_manager.v3 import http_connection_manager_pb2 as hcm
from google.protobuf import wrappers_pb2
from stoa_proto.bodies import CONTENT_TYPE, DENY_BODIES
from stoa_proto.decisions import DENIALS, Reason

from stoa_translate.filters import cel_filter

JWT_DENIED = "jwt_authn_access_denied"
RBAC_DENIED = "rbac_access_denied_matched_policy"
# The rbac policies of the native decision, named after what they deny (`claims`). A CP policy id
# cannot hold ':', so an address rule's denial (named after its policy id) never reads as one of these.
POLICIES: dict[Reason, str] = {
    Reason.MALFORMED_REQUEST: "stoa:malformed",
    Reason.INVALID_TOKEN: "stoa:token",
    Reason.TENANT_MISMATCH: "stoa:tenant",
    Reason.INSUFFICIENT_SCOPE: "stoa:scope",
}

# Envoy's response code details of a native denial → its reason.
EXACT: dict[str, Reason] = {
    f"{JWT_DENIED}{{Jwt_is_missing}}": Reason.MISSING_TOKEN,
    f"{JWT_DENIED}{{Jwt_is_expired}}": Reason.EXPIRED_TOKEN,
    f"{JWT_DENIED}{{Jwt_issuer_is_not_configured}}": Reason.WRONG_ISSUER,
    f"{JWT_DENIED}{{Audiences_in_Jwt_are_not_allowed}}": Reason.WRONG_AUDIENCE,
    **{f"{RBAC_DENIED}[{name}]": reason for reason, name in POLICIES.items()},
}
# Every other way jwt_authn refuses a token (bad signature, malformed, unknown key, not yet valid...).
TOKEN_REFUSED = f"{JWT_DENIED}{{"


def reason_of(details: str) -> Reason | None:
    """The reason of a native denial, or None when `details` is not one."""
    reason = EXACT.get(details)
    if reason is None and details.startswith(TOKEN_REFUSED):
        return Reason.INVALID_TOKEN
    return reason


def _is(details: str) -> str:
    return f"response.code_details == '{details}'"


def native_denial_filter() -> accesslog_pb2.AccessLogFilter:
    """Selects the responses that are native denials. Every one is a local reply of 400 or more, so
    the status is compared first and the CEL expression (~20,000 instructions, a sixth of what the
    native decision costs Envoy: bench/PROFILE-native.md) runs only for such a response."""
    at_least_400 = accesslog_pb2.AccessLogFilter(
        status_code_filter=accesslog_pb2.StatusCodeFilter(
            comparison=accesslog_pb2.ComparisonFilter(
                op=accesslog_pb2.ComparisonFilter.GE,
                value=base_pb2.RuntimeUInt32(default_value=400, runtime_key="stoa.native_denial_status"),
            )
        )
    )
    details = cel_filter(
        " || ".join([*map(_is, EXACT), f"response.code_details.startsWith('{TOKEN_REFUSED}')"])
    )
    # An and_filter stops at the first filter that does not match.
    return accesslog_pb2.AccessLogFilter(and_filter=accesslog_pb2.AndFilter(filters=[at_least_400, details]))


def _mapper(selector: str, reason: Reason) -> hcm.ResponseMapper:
    status, challenge = DENIALS[reason]
    mapper = hcm.ResponseMapper(
        filter=cel_filter(selector),
        status_code=wrappers_pb2.UInt32Value(value=status),
        body=base_pb2.DataSource(inline_string=DENY_BODIES[status].decode()),
        body_format_override=substitution_format_string_pb2.SubstitutionFormatString(
            text_format_source=base_pb2.DataSource(inline_string="%LOCAL_REPLY_BODY%"),
            content_type=CONTENT_TYPE,
        ),
    )
    if challenge:
        # Replaces jwt_authn's own challenge, whose realm is the request URL.
        mapper.headers_to_add.append(
            base_pb2.HeaderValueOption(
                header=base_pb2.HeaderValue(key="www-authenticate", value=challenge),
                append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD,
            )
        )
    return mapper


def local_reply_mappers() -> list[hcm.ResponseMapper]:
    """The mappers answering native denials as the service would (first match wins: exact first)."""
    return [
        *(_mapper(_is(details), reason) for details, reason in EXACT.items()),
        _mapper(f"response.code_details.startsWith('{TOKEN_REFUSED}')", Reason.INVALID_TOKEN),
    ]
