"""Phase 2, strip: find every inbound identity header, and take the credential out for identify.

The inbound identity headers are `stoa_proto.client_headers` (the one list, with its reasons): Envoy
strips them before any filter runs, so they reach this phase only if that stripping is ever lost;
they never count here, and an allow removes any that arrive. Of the credentials (`authorization`, `cookie`,
`proxy-authorization`) only the `authorization` value goes on, to the identify phase only, and on an
api_key route the value of its key header; no later phase reads headers, so nothing else is kept.
"""

from __future__ import annotations

from dataclasses import dataclass

from stoa_proto.client_headers import is_identity_header


@dataclass(frozen=True, slots=True)
class Stripped:
    # The Authorization header value, for the identify phase only.
    authorization: str | None
    # Inbound identity headers the client sent (lower-case names), to remove upstream.
    inbound_identity: tuple[str, ...]
    # The API key, from the route's key header only (never the query string), for identify only.
    api_key: str | None = None


def strip(headers: dict[str, str], key_header: str = "") -> Stripped:
    inbound = tuple(name for name in headers if is_identity_header(name))
    key = headers.get(key_header) if key_header else None
    return Stripped(headers.get("authorization"), inbound, key)
