"""Phase 2, strip: find every inbound identity header, and take the credential out for identify.

THE list (documented in the README): names starting with `x-stoa-`, `x-user-`, `x-auth-`, and the
names `x-tenant-id`, `x-forwarded-user` are inbound identity headers — never trusted, and removed
before the request reaches the upstream. Of the credentials (`authorization`, `cookie`,
`proxy-authorization`) only the `authorization` value goes on, to the identify phase only; no later
phase reads headers, so nothing else is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

IDENTITY_PREFIXES = ("x-stoa-", "x-user-", "x-auth-")
IDENTITY_NAMES = frozenset({"x-tenant-id", "x-forwarded-user"})


def is_identity_header(name: str) -> bool:
    return name in IDENTITY_NAMES or name.startswith(IDENTITY_PREFIXES)


@dataclass(frozen=True, slots=True)
class Stripped:
    # The Authorization header value, for the identify phase only.
    authorization: str | None
    # Inbound identity headers the client sent (lower-case names), to remove upstream.
    inbound_identity: tuple[str, ...]


def strip(headers: dict[str, str]) -> Stripped:
    inbound = tuple(name for name in headers if is_identity_header(name))
    return Stripped(headers.get("authorization"), inbound)
