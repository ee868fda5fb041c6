"""The `RateLimit-Policy` and `RateLimit` response fields of the IETF httpapi draft
(draft-ietf-httpapi-ratelimit-headers, structured fields): `"name";q=<quota>;w=<window seconds>` and
`"name";r=<remaining>;t=<seconds until reset>`."""

from __future__ import annotations

from stoa_quota.store import Outcome


def rate_limit_fields(name: str, outcome: Outcome) -> list[tuple[str, str]]:
    """The two fields for a quota named `name` (a token: letters, digits, `._-`)."""
    return [
        ("ratelimit-policy", f'"{name}";q={outcome.limit};w={outcome.window.seconds}'),
        ("ratelimit", f'"{name}";r={outcome.remaining};t={outcome.reset_s}'),
    ]
