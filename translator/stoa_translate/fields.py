"""The acceptance rules of the contract's fields, one implementation for the CP and the site.

The CP runs them on every write (a ValueError becomes a 422 naming the field, and nothing is stored),
the translator on every inventory (a ValueError becomes a refusal naming the route): what the CP
accepts, the site accepts. Each raises ValueError with a message that completes "<field> ...".
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from stoa_proto.client_headers import is_identity_header

HTTP_METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
AUTH_MODES = ("jwt", "none", "api_key")
DEFAULT_KEY_HEADER = "x-api-key"
MAX_URL_LENGTH = 2048
MAX_SCOPES = 64
MAX_SCOPE_LENGTH = 128

# One path segment of RFC 3986 path characters; no query, fragment, blank or control character.
_SEGMENT = re.compile(r"^[A-Za-z0-9\-._~!$&'()*+,;=:@%]+$")
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9-]{1,63}(?<!-)$")
_IP_LIKE = re.compile(r"^[0-9.]+$|:")
_SCOPE = re.compile(r"^[\x21\x23-\x5b\x5d-\x7e]+$")  # RFC 6749 scope-token characters
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$")  # an RFC 9110 token


def is_header_name(name: str, *, lower_case: bool = False) -> bool:
    """An HTTP header name (a token); with `lower_case`, only as HTTP/2 and Envoy's mutations write it."""
    return bool(_HEADER_NAME.match(name)) and (not lower_case or name == name.lower())


@dataclass(frozen=True)
class Upstream:
    """An upstream URL taken apart: where to connect, and the base path that replaces the prefix."""

    scheme: str
    host: str  # lower-case name, or the IP address in its canonical text
    port: int
    is_ip: bool
    base_path: str  # without a trailing slash; "/" for none


def path(value: str) -> str:
    """An absolute, normalised URL path (no '//', '.' or '..' segments); returned without its trailing
    slash ("/" for the root)."""
    if len(value) > MAX_URL_LENGTH:
        raise ValueError(f"must be at most {MAX_URL_LENGTH} characters")
    if not value.startswith("/"):
        raise ValueError("must start with '/'")
    trimmed = value.rstrip("/")
    if not trimmed:
        return "/"
    segments = trimmed.split("/")[1:]
    if not all(_SEGMENT.match(segment) for segment in segments):
        raise ValueError("must contain only URL path characters, with no empty ('//') segment")
    if any(segment in (".", "..") for segment in segments):
        raise ValueError("must be a normalised path (no '.' or '..' segments)")
    return trimmed


def upstream_url(value: str) -> Upstream:
    """http(s)://host[:port][/path]: no credentials, query or fragment; a host that is an IP literal or
    an ASCII DNS name (IDNs in their xn-- form)."""
    if len(value) > MAX_URL_LENGTH:
        raise ValueError(f"must be at most {MAX_URL_LENGTH} characters")
    if any(c.isspace() for c in value):
        raise ValueError("must not contain whitespace")
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL")
    if not parts.hostname:
        raise ValueError("must name a host")
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials")
    if parts.query or parts.fragment or "?" in value or "#" in value:
        raise ValueError("must not have a query or fragment")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("has an invalid port") from None
    # Port 0 is no port: `port or default` would quietly dial 80/443.
    if port == 0:
        raise ValueError("has an invalid port (0)")
    host = parts.hostname
    address = None
    if _IP_LIKE.search(host):  # the costly parse only for what may be an address (10,000 routes)
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            raise ValueError(f"host {host!r} is not a valid IP address") from None
        if getattr(address, "scope_id", None) is not None:
            # A zone (`%eth0`) names an interface of one machine: Envoy cannot dial it and refuses
            # the whole cluster set, so every route of the gateway would wait behind this one.
            raise ValueError(f"host {host!r} has a zone id (an IPv6 address with '%')")
    elif "[" in parts.netloc or not all(_HOST_LABEL.match(label) for label in host.split(".")):
        raise ValueError(f"host {host!r} is not a DNS name (letters, digits and '-' per label; IDNs as xn--)")
    base = "/"
    if parts.path:
        try:
            base = path(parts.path)
        except ValueError as exc:
            raise ValueError(f"path {exc}") from None
    default_port = 443 if parts.scheme == "https" else 80
    return Upstream(
        scheme=parts.scheme,
        host=host.lower() if address is None else str(address),
        port=port or default_port,
        is_ip=address is not None,
        base_path=base,
    )


def method(value: str) -> str:
    """An HTTP method in its normal (upper-case) form: `get` is `GET`."""
    upper = value.upper()
    if upper not in HTTP_METHODS:
        raise ValueError(f"{value!r} is not one of {', '.join(HTTP_METHODS)}")
    return upper


def methods(values: Iterable[str]) -> list[str]:
    """Normal forms, first occurrence kept, in the order given."""
    return list(dict.fromkeys(method(value) for value in values))


def scopes(values: Iterable[str]) -> list[str]:
    out = list(dict.fromkeys(values))
    if len(out) > MAX_SCOPES:
        raise ValueError(f"must hold at most {MAX_SCOPES} scopes")
    for scope in out:
        if len(scope) > MAX_SCOPE_LENGTH or not _SCOPE.match(scope):
            raise ValueError(f"{scope!r} is not a scope token (1 to {MAX_SCOPE_LENGTH} visible characters)")
    return out


def auth_mode(value: str) -> str:
    if value not in AUTH_MODES:
        raise ValueError(f"{value!r} is not one of {', '.join(AUTH_MODES)}")
    return value


_HEADER_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
# Headers with another meaning on the way in: a key there would be read, forwarded or logged as such.
_NOT_KEY_HEADERS = frozenset(
    {
        "authorization",
        "proxy-authorization",
        "cookie",
        "host",
        "content-type",
        "content-length",
        "x-request-id",
        "x-forwarded-for",
        "x-forwarded-proto",
    }
)


def key_header(value: str) -> str:
    """The request header an api_key route reads its key from (lower-case)."""
    name = value.strip().lower()
    if not _HEADER_NAME.match(name):
        raise ValueError(f"{value!r} is not a header name (letters, digits, '-', at most 64)")
    if name in _NOT_KEY_HEADERS or is_identity_header(name) or name.startswith("x-envoy-"):
        raise ValueError(f"{name!r} carries something else and cannot carry an API key")
    return name
