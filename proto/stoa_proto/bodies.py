"""Neutral deny bodies: one JSON document per status, naming no check.

Shared by the authorization service (its own denials) and the Link (Envoy's local reply when the
authorization service is unreachable). The 503 body is byte-identical to the 403 body so a client
cannot tell an outage from a refusal.
"""

from __future__ import annotations

CONTENT_TYPE = "application/json"

_DENIED = b'{"error":"access_denied","message":"The request was not authorized."}'

DENY_BODIES: dict[int, bytes] = {
    400: b'{"error":"bad_request","message":"The request could not be processed."}',
    401: b'{"error":"unauthorized","message":"Authentication is required."}',
    403: _DENIED,
    503: _DENIED,
}
