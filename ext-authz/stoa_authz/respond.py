"""Phase 5, respond: the CheckResponse Envoy acts on.

Allow: headers for the upstream (overwriting any client-sent header of the same name) and removal of
every other inbound identity header. Deny: status, `WWW-Authenticate` where it applies, and the
neutral body for the status. Deny responses are built once per reason at import.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.service.auth.v3.external_auth_pb2 import CheckResponse, DeniedHttpResponse, OkHttpResponse
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.rpc import code_pb2, status_pb2
from stoa_proto.bodies import CONTENT_TYPE, DENY_BODIES
from stoa_proto.decisions import API_HEADER, CONSUMER_HEADER, IDENTITY_HEADER, SUBJECT_HEADER, TENANT_HEADER

from stoa_authz.reasons import DENIALS, Reason

RETRY_AFTER_S = "1"

_OVERWRITE = HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD
_GRPC_CODE = {
    400: code_pb2.INVALID_ARGUMENT,
    401: code_pb2.UNAUTHENTICATED,
    429: code_pb2.RESOURCE_EXHAUSTED,
    503: code_pb2.UNAVAILABLE,
}


def _header(name: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(header=HeaderValue(key=name, value=value), append_action=_OVERWRITE)


def _denial(reason: Reason, extra: Sequence[tuple[str, str]] = ()) -> CheckResponse:
    status, challenge = DENIALS[reason]
    headers = [_header("content-type", CONTENT_TYPE), *(_header(name, value) for name, value in extra)]
    if challenge:
        headers.append(_header("www-authenticate", challenge))
    if status == 503:
        headers.append(_header("retry-after", RETRY_AFTER_S))
    return CheckResponse(
        status=status_pb2.Status(code=_GRPC_CODE.get(status, code_pb2.PERMISSION_DENIED)),
        denied_response=DeniedHttpResponse(
            status=HttpStatus(code=status),  # type: ignore[arg-type]
            headers=headers,
            body=DENY_BODIES[status].decode(),
        ),
    )


DENY_RESPONSES: dict[Reason, CheckResponse] = {reason: _denial(reason) for reason in DENIALS}


def deny(reason: Reason, headers: Sequence[tuple[str, str]] = ()) -> CheckResponse:
    """The denial for `reason`; with `headers` (a quota's), built for this request."""
    return _denial(reason, headers) if headers else DENY_RESPONSES[reason]


@dataclass(frozen=True, slots=True)
class Grant:
    """The identity headers of an allow, built once per route (and per cached decision)."""

    headers: tuple[HeaderValueOption, ...]
    # Their names, plus the envelope's when the allow carries one: not removed, overwritten.
    names: frozenset[str]


def grant(
    tenant: str, api: str, subject: str | None = None, consumer: str | None = None, *, envelope: bool = False
) -> Grant:
    headers = [_header(TENANT_HEADER, tenant), _header(API_HEADER, api)]
    if subject is not None:
        headers.append(_header(SUBJECT_HEADER, subject))
    if consumer is not None:
        headers.append(_header(CONSUMER_HEADER, consumer))
    names = {h.header.key for h in headers} | ({IDENTITY_HEADER} if envelope else set())
    return Grant(tuple(headers), frozenset(names))


_OK = status_pb2.Status(code=code_pb2.OK)


def allow(
    grant: Grant,
    inbound_identity: Iterable[str],
    envelope: str | None = None,
    response_headers: Sequence[tuple[str, str]] = (),
) -> CheckResponse:
    """`response_headers` go to the client with the upstream's answer (a quota's RateLimit fields)."""
    ok = OkHttpResponse(headers=grant.headers)
    ok.response_headers_to_add.extend(_header(name, value) for name, value in response_headers)
    if envelope is not None:
        ok.headers.append(_header(IDENTITY_HEADER, envelope))
    # What we set is overwritten in place; everything else the client sent goes.
    ok.headers_to_remove.extend(name for name in inbound_identity if name not in grant.names)
    return CheckResponse(status=_OK, ok_response=ok)
