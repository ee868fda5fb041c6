"""The closed set of decision reasons and the HTTP answer each one maps to."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    ALLOWED = "allowed"
    MISSING_TOKEN = "missing_token"
    INVALID_TOKEN = "invalid_token"
    EXPIRED_TOKEN = "expired_token"
    WRONG_ISSUER = "wrong_issuer"
    WRONG_AUDIENCE = "wrong_audience"
    TENANT_MISMATCH = "tenant_mismatch"
    INSUFFICIENT_SCOPE = "insufficient_scope"
    MALFORMED_REQUEST = "malformed_request"
    UNKNOWN_ROUTE = "unknown_route"
    POLICY_UNAVAILABLE = "policy_unavailable"
    NOT_CONFIGURED = "not_configured"
    INTERNAL_ERROR = "internal_error"


class Deny(Exception):
    """Raised by a phase to end the decision with a denial."""

    def __init__(self, reason: Reason) -> None:
        super().__init__(reason.value)
        self.reason = reason


_INVALID = 'Bearer error="invalid_token"'
_SCOPE = 'Bearer error="insufficient_scope"'

# reason -> (HTTP status, WWW-Authenticate value or None)
DENIALS: dict[Reason, tuple[int, str | None]] = {
    Reason.MISSING_TOKEN: (401, "Bearer"),
    Reason.INVALID_TOKEN: (401, _INVALID),
    Reason.EXPIRED_TOKEN: (401, _INVALID),
    Reason.WRONG_ISSUER: (401, _INVALID),
    Reason.WRONG_AUDIENCE: (401, _INVALID),
    Reason.TENANT_MISMATCH: (403, _SCOPE),
    Reason.INSUFFICIENT_SCOPE: (403, _SCOPE),
    Reason.MALFORMED_REQUEST: (400, None),
    Reason.UNKNOWN_ROUTE: (403, None),
    # The service cannot enforce: 503, whose body is identical to the 403's.
    Reason.POLICY_UNAVAILABLE: (503, None),
    Reason.NOT_CONFIGURED: (503, None),
    Reason.INTERNAL_ERROR: (503, None),
}
