"""Phase 2, strip: take every inbound identity header and credential out of the decision input.

THE list (documented in the README): names starting with `x-stoa-`, `x-user-`, `x-auth-`, and the
names `x-tenant-id`, `x-forwarded-user` are inbound identity headers — never trusted, and removed
before the request reaches the upstream. `authorization`, `cookie` and `proxy-authorization` are
credentials: removed from the decision input (the bearer token goes to the identify phase only).
"""

from __future__ import annotations

from dataclasses import dataclass

IDENTITY_PREFIXES = ("x-stoa-", "x-user-", "x-auth-")
IDENTITY_NAMES = frozenset({"x-tenant-id", "x-forwarded-user"})
CREDENTIAL_NAMES = frozenset({"authorization", "cookie", "proxy-authorization"})


def is_identity_header(name: str) -> bool:
    return name in IDENTITY_NAMES or name.startswith(IDENTITY_PREFIXES)


@dataclass(frozen=True, slots=True)
class Stripped:
    # The gateway-neutral decision input.
    headers: dict[str, str]
    # The Authorization header value, for the identify phase only.
    authorization: str | None
    # Inbound identity headers the client sent (lower-case names), to remove upstream.
    inbound_identity: tuple[str, ...]


def strip(headers: dict[str, str]) -> Stripped:
    kept: dict[str, str] = {}
    inbound: list[str] = []
    for name, value in headers.items():
        if is_identity_header(name):
            inbound.append(name)
        elif name not in CREDENTIAL_NAMES:
            kept[name] = value
    return Stripped(kept, headers.get("authorization"), tuple(inbound))
