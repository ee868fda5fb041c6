"""The closed set of processing outcomes and the HTTP answer each denial maps to."""

from __future__ import annotations

from enum import StrEnum


class Reason(StrEnum):
    ALLOWED = "allowed"
    REDACTED = "redacted"
    TOO_LARGE = "too_large"
    GUARDRAIL_BLOCKED = "guardrail_blocked"
    SCHEMA_INVALID = "schema_invalid"
    MALFORMED_BODY = "malformed_body"
    TOKEN_BUDGET_EXCEEDED = "token_budget_exceeded"
    NO_CONSUMER = "no_consumer"
    QUOTA_UNAVAILABLE = "quota_unavailable"
    UNKNOWN_ROUTE = "unknown_route"
    POLICY_UNAVAILABLE = "policy_unavailable"
    INTERNAL_ERROR = "internal_error"


class Deny(Exception):
    """Raised by a phase to end the exchange with a denial; `path` only for a schema failure (the
    JSON path in the client's own document), `retry_after` (seconds) for an exhausted budget."""

    def __init__(self, reason: Reason, path: str | None = None, retry_after: int | None = None) -> None:
        super().__init__(reason.value)
        self.reason = reason
        self.path = path
        self.retry_after = retry_after


DENIAL_STATUS: dict[Reason, int] = {
    Reason.TOO_LARGE: 413,
    Reason.GUARDRAIL_BLOCKED: 403,
    Reason.SCHEMA_INVALID: 422,
    Reason.MALFORMED_BODY: 400,
    Reason.TOKEN_BUDGET_EXCEEDED: 429,
    # A budget per consumer on a request the authorization service named no consumer for.
    Reason.NO_CONSUMER: 403,
    Reason.UNKNOWN_ROUTE: 403,
    # The service cannot enforce: 503 with Retry-After, body identical to the 403's.
    Reason.POLICY_UNAVAILABLE: 503,
    Reason.QUOTA_UNAVAILABLE: 503,
    Reason.INTERNAL_ERROR: 503,
}
