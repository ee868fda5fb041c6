"""Neutral deny bodies: one JSON document per status, naming no check.

Shared by the authorization service (its own denials) and the Link (Envoy's local reply when the
authorization service is unreachable). The 503 body is byte-identical to the 403 body so a client
cannot tell an outage from a refusal.
"""

from __future__ import annotations

CONTENT_TYPE = "application/json"


def media_type(content_type: str) -> str:
    """The media type of a `content-type` value, without its parameters, in lower case (it has none)."""
    return content_type.split(";", 1)[0].strip().lower()


_DENIED = b'{"error":"access_denied","message":"The request was not authorized."}'

DENY_BODIES: dict[int, bytes] = {
    400: b'{"error":"bad_request","message":"The request could not be processed."}',
    401: b'{"error":"unauthorized","message":"Authentication is required."}',
    403: _DENIED,
    429: b'{"error":"too_many_requests","message":"The quota of this plan is used up."}',
    503: _DENIED,
}

# The processing service's denials (and Envoy's own 413 when a body overflows its buffer, mapped by
# the Link to the same body). A schema failure's 422 body adds the failing JSON path of the client's
# own document to SCHEMA_BODY's fields.
PROC_BODIES: dict[str, bytes] = {
    "too_large": b'{"error":"payload_too_large","message":"The body is larger than allowed."}',
    "guardrail_blocked": b'{"error":"guardrail_blocked","message":"The content was refused by a policy."}',
    "malformed_body": DENY_BODIES[400],
    "token_budget_exceeded": b'{"error":"token_budget_exceeded","message":"The token budget is used up."}',
}
SCHEMA_ERROR = "schema_invalid"
SCHEMA_MESSAGE = "The request body does not match the expected schema."
