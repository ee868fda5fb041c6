"""Phase 3, respond: the ProcessingResponses Envoy acts on.

Continue a phase unchanged, replace a body (then `content-length` is set to the new size and
`content-encoding` removed: the new body is sent as plain bytes), or end the exchange with an
immediate response carrying the neutral JSON body of its reason.
"""

from __future__ import annotations

import json

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3.external_processor_pb2 import (
    BodyMutation,
    BodyResponse,
    CommonResponse,
    HeaderMutation,
    HeadersResponse,
    ImmediateResponse,
    ProcessingResponse,
)
from envoy.type.v3.http_status_pb2 import HttpStatus
from stoa_proto.bodies import CONTENT_TYPE, DENY_BODIES, PROC_BODIES, SCHEMA_ERROR, SCHEMA_MESSAGE

from stoa_proc.reasons import DENIAL_STATUS, Reason

RETRY_AFTER_S = "1"
_OVERWRITE = HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD


def _header(name: str, value: str) -> HeaderValueOption:
    return HeaderValueOption(header=HeaderValue(key=name, raw_value=value.encode()), append_action=_OVERWRITE)


def body_of(reason: Reason, path: str | None = None) -> bytes:
    if reason is Reason.SCHEMA_INVALID:
        return json.dumps(
            {"error": SCHEMA_ERROR, "message": SCHEMA_MESSAGE, "path": path or "$"}, separators=(",", ":")
        ).encode()
    return PROC_BODIES.get(reason.value) or DENY_BODIES[DENIAL_STATUS[reason]]


def immediate(reason: Reason, path: str | None = None, retry_after: int | None = None) -> ProcessingResponse:
    status = DENIAL_STATUS[reason]
    headers = [_header("content-type", CONTENT_TYPE)]
    if retry_after is not None:
        headers.append(_header("retry-after", str(retry_after)))
    elif status == 503:
        headers.append(_header("retry-after", RETRY_AFTER_S))
    return ProcessingResponse(
        immediate_response=ImmediateResponse(
            status=HttpStatus(code=status),  # type: ignore[arg-type]
            headers=HeaderMutation(set_headers=headers),
            body=body_of(reason, path),
            details=f"stoa_proc_{reason.value}",
        )
    )


# The plain "continue" of each phase, built once: most answers are one of these (never mutated).
_PROCEED_HEADERS = {
    True: ProcessingResponse(request_headers=HeadersResponse()),
    False: ProcessingResponse(response_headers=HeadersResponse()),
}
_PROCEED_BODY = {
    True: ProcessingResponse(request_body=BodyResponse()),
    False: ProcessingResponse(response_body=BodyResponse()),
}
# The response headers of a server-sent event stream: the body is then sent chunk by chunk.
_STREAMED = ProcessingMode(response_body_mode=ProcessingMode.STREAMED)
_PROCEED_STREAMED = ProcessingResponse(response_headers=HeadersResponse(), mode_override=_STREAMED)


def proceed_headers(
    request: bool,
    streamed: bool = False,
    set_headers: tuple[tuple[str, str], ...] = (),
    remove_headers: tuple[str, ...] = (),
) -> ProcessingResponse:
    """Continue with the headers (edited); `streamed`: the response body follows in streamed mode."""
    if not (set_headers or remove_headers):
        return _PROCEED_STREAMED if streamed and not request else _PROCEED_HEADERS[request]
    headers = HeadersResponse()
    headers.response.header_mutation.CopyFrom(
        HeaderMutation(
            set_headers=[_header(name, value) for name, value in set_headers],
            remove_headers=remove_headers,
        )
    )
    response = (
        ProcessingResponse(request_headers=headers)
        if request
        else ProcessingResponse(response_headers=headers)
    )
    if streamed:
        response.mode_override.CopyFrom(_STREAMED)
    return response


def proceed_body(request: bool) -> ProcessingResponse:
    return _PROCEED_BODY[request]


def replace_body(request: bool, body: bytes, *, whole: bool) -> ProcessingResponse:
    """A new body; `whole` (a buffered body) also fixes the headers Envoy still holds."""
    common = CommonResponse(body_mutation=BodyMutation(body=body))
    if whole:
        common.header_mutation.CopyFrom(
            HeaderMutation(
                set_headers=[_header("content-length", str(len(body)))], remove_headers=["content-encoding"]
            )
        )
    response = BodyResponse(response=common)
    return (
        ProcessingResponse(request_body=response) if request else ProcessingResponse(response_body=response)
    )
