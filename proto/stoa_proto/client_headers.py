"""Request headers a client may send that no upstream ever receives from it: THE list, with the reason.

Shared by the Link (Envoy strips them before any filter runs, on every route, whatever its auth mode)
and the authorization service (they never count in a decision). Names are lower-case and matched in
any letter case; a prefix covers every name that starts with it.

- Identity: an upstream behind a gateway trusts these to say who the caller is. STOA sets its own
  `x-stoa-*` after the decision; the others are what upstreams migrated from other gateways trust
  (Kong's consumer and credential headers, oauth2-proxy's `x-auth-request-*`, Apache and nginx
  `remote-user`, `x-forwarded-user`, ...). A site adds the names its own upstreams trust with the
  Link setting `EXTRA_IDENTITY_HEADERS`; the defaults cannot be removed.
- Overrides: frameworks that honour them turn an authorised GET into a DELETE, or route to another
  path than the one authorised.
"""

from __future__ import annotations

from collections.abc import Iterable

IDENTITY_PREFIXES: tuple[str, ...] = ("x-stoa-", "x-user-", "x-auth-", "x-auth-request-")
IDENTITY_NAMES: tuple[str, ...] = (
    "x-tenant-id",
    "x-forwarded-user",
    "x-remote-user",
    "remote-user",
    "x-consumer-id",
    "x-consumer-username",
    "x-consumer-custom-id",
    "x-credential-identifier",
    "x-anonymous-consumer",
)
OVERRIDE_NAMES: tuple[str, ...] = (
    "x-http-method-override",
    "x-http-method",
    "x-method-override",
    "x-original-url",
    "x-rewrite-url",
)


def is_identity_header(name: str) -> bool:
    """`name` lower-case."""
    return name in _IDENTITY_NAMES or name.startswith(IDENTITY_PREFIXES)


def extra_names(value: str) -> tuple[str, ...]:
    """A site's comma-separated extra identity header names, validated and lower-cased.

    A name ending in `*` is a prefix. Raises ValueError for anything that is not a header name.
    """
    names = []
    for part in value.split(","):
        name = part.strip().lower()
        if not name:
            continue
        bare = name.removesuffix("*")
        if not bare or not all(c.isalnum() or c == "-" for c in bare) or not bare.isascii():
            raise ValueError(f"{part.strip()!r} is not a header name (letters, digits, '-'; '*' at the end)")
        names.append(name)
    return tuple(dict.fromkeys(names))


def removed(extra: Iterable[str] = ()) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(prefixes, exact names) a gateway strips: the defaults plus a site's `extra_names`."""
    extra = tuple(extra)
    prefixes = IDENTITY_PREFIXES + tuple(n.removesuffix("*") for n in extra if n.endswith("*"))
    names = IDENTITY_NAMES + OVERRIDE_NAMES + tuple(n for n in extra if not n.endswith("*"))
    # A prefix covers its longer prefixes and names: keep the list Envoy evaluates short.
    kept_prefixes = tuple(
        dict.fromkeys(p for p in prefixes if not any(p != q and p.startswith(q) for q in prefixes))
    )
    kept_names = tuple(dict.fromkeys(n for n in names if not n.startswith(kept_prefixes)))
    return kept_prefixes, kept_names


_IDENTITY_NAMES = frozenset(IDENTITY_NAMES)
