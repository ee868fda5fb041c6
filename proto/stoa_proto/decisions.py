"""The closed set of decision reasons and the HTTP answer each denial maps to: one error contract.

Shared by the authorization service (its own denials) and the translator (Envoy's local replies for
the denials its built-in filters make, and the decision events derived from them), so a client sees
the same status and `WWW-Authenticate` whichever of the two decided. Bodies: `stoa_proto.bodies`.
"""

from __future__ import annotations

import re
from enum import StrEnum

DECISION_EVENT = "ext_authz_decision"

# The identity an allowed request carries to the upstream, whichever placement decided it.
TENANT_HEADER = "x-stoa-tenant-id"
API_HEADER = "x-stoa-api-id"
SUBJECT_HEADER = "x-stoa-subject"
# The consumer (API key holder, or the OAuth client's) on routes that know one.
CONSUMER_HEADER = "x-stoa-consumer-id"
# The signed identity envelope: only the authorization service mints it.
IDENTITY_HEADER = "x-stoa-identity"

# What both verifiers accept as a token, so that a request gets the same answer wherever it is decided.
# The scheme in these spellings only: Envoy's jwt_authn matches header prefixes case-sensitively.
BEARER_SCHEMES = ("Bearer", "bearer", "BEARER")
# Leeway on exp and nbf.
CLOCK_SKEW_S = 30

# A claim copied into an upstream header (`sub` → x-stoa-subject) must arrive as the token says it, so
# it is visible ASCII, spaces inside only. A control character would break the header (a retryable
# 503 instead of a 401); a space at either end is trimmed by every HTTP parser, so " admin" would
# reach the upstream as "admin"; anything beyond ASCII is read by most servers as Latin-1 (`é` as
# `Ã©`), another identity again. Anything else is `invalid_token`. RE2 (Envoy's rbac on the verified
# payload) and Python's `re` read this pattern alike, as a full match.
HEADER_CLAIM = "[!-~](?:[ -~]*[!-~])?"
_HEADER_CLAIM = re.compile(HEADER_CLAIM)


def is_header_claim(value: object) -> bool:
    """Whether `value` (a claim) can be copied into an upstream header unchanged."""
    return isinstance(value, str) and _HEADER_CLAIM.fullmatch(value) is not None


class Reason(StrEnum):
    ALLOWED = "allowed"
    MISSING_TOKEN = "missing_token"
    INVALID_TOKEN = "invalid_token"
    EXPIRED_TOKEN = "expired_token"
    WRONG_ISSUER = "wrong_issuer"
    WRONG_AUDIENCE = "wrong_audience"
    TENANT_MISMATCH = "tenant_mismatch"
    INSUFFICIENT_SCOPE = "insufficient_scope"
    INVALID_KEY = "invalid_key"
    NO_SUBSCRIPTION = "no_subscription"
    QUOTA_EXCEEDED = "quota_exceeded"
    QUOTA_UNAVAILABLE = "quota_unavailable"
    POLICY_DENIED = "policy_denied"
    MALFORMED_REQUEST = "malformed_request"
    UNKNOWN_ROUTE = "unknown_route"
    POLICY_UNAVAILABLE = "policy_unavailable"
    NOT_CONFIGURED = "not_configured"
    INTERNAL_ERROR = "internal_error"


# No realm: a realm naming the request URL (Envoy's own default) would echo client input.
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
    # An API key is not a bearer token: no challenge that would invite one.
    Reason.INVALID_KEY: (401, None),
    Reason.NO_SUBSCRIPTION: (403, None),
    # With Retry-After (the window's reset) and the RateLimit fields.
    Reason.QUOTA_EXCEEDED: (429, None),
    # The route's OPA policy did not say true.
    Reason.POLICY_DENIED: (403, None),
    # The count could not be made (billed: PostgreSQL unreachable; batched: degraded too long).
    Reason.QUOTA_UNAVAILABLE: (503, None),
    Reason.MALFORMED_REQUEST: (400, None),
    Reason.UNKNOWN_ROUTE: (403, None),
    # The service cannot enforce: 503, whose body is identical to the 403's.
    Reason.POLICY_UNAVAILABLE: (503, None),
    Reason.NOT_CONFIGURED: (503, None),
    Reason.INTERNAL_ERROR: (503, None),
}
