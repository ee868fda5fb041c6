"""The syntax of the API's text fields: the regular expressions the OpenAPI document publishes, each
with what it says in words.

Each pattern is enforced as published (a value that does not match is refused), and every value
that matches also passes the site's own rule for the field (`stoa_translate.fields` and the policy
kinds), so a request that fits the schema is never refused for its syntax. Where a rule is wider
than a regular expression can say exactly (an IPv6 range in every textual form, say), the pattern
keeps to a part of it that covers the usual spellings.

A refusal says the rule in words next to the field it names, never the regular expression: a field
type puts `Syntax` after its own rules (whose messages are more precise), so the words are only for
what the pattern alone refuses.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import GetCoreSchemaHandler, GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema


@dataclass(frozen=True)
class Syntax:
    """`Annotated[str, ..., Syntax(pattern, says)]`: published as the JSON Schema `pattern`, enforced
    with `says` as the 422's message."""

    pattern: str
    says: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        compiled = re.compile(self.pattern)

        def check(value: str) -> str:
            # fullmatch: `$` alone would let a value end in a newline the published pattern refuses.
            if compiled.fullmatch(value) is None:
                raise ValueError(self.says)
            return value

        return core_schema.no_info_after_validator_function(check, handler(source))

    def __get_pydantic_json_schema__(
        self, schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        published = handler(schema)
        published["pattern"] = self.pattern
        return published


_PCHAR = r"A-Za-z0-9\-_~!$&'()*+,;=:@%"
# A path segment other than "." and "..".
_SEGMENT = rf"(?:[{_PCHAR}][{_PCHAR}.]*|\.[{_PCHAR}][{_PCHAR}.]*|\.\.[{_PCHAR}.]+)"
_PATH = rf"/(?:{_SEGMENT}(?:/{_SEGMENT})*/?)?"

_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
# The last label starts with a letter, so a name is never taken for an IP address.
_TOP_LABEL = r"[A-Za-z](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = rf"{_OCTET}(?:\.{_OCTET}){{3}}"
_H16 = r"[0-9A-Fa-f]{1,4}"
_IPV6 = (
    rf"(?:(?:{_H16}:){{7}}{_H16}|(?:{_H16}:){{1,7}}:|(?:{_H16}:){{1,6}}:{_H16}"
    rf"|(?:{_H16}:){{1,5}}(?::{_H16}){{1,2}}|(?:{_H16}:){{1,4}}(?::{_H16}){{1,3}}"
    rf"|(?:{_H16}:){{1,3}}(?::{_H16}){{1,4}}|(?:{_H16}:){{1,2}}(?::{_H16}){{1,5}}"
    rf"|{_H16}:(?::{_H16}){{1,6}}|:(?:(?::{_H16}){{1,7}}|:))"
)
_HOST = rf"(?:(?:{_LABEL}\.)*{_TOP_LABEL}|{_IPV4}|\[{_IPV6}\])"
_PORT = r"(?::(?:6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?"

PATH = Syntax(
    rf"^{_PATH}$",
    "must be a path: '/' then URL path characters, with no empty ('//'), '.' or '..' segment",
)
UPSTREAM_URL = Syntax(
    rf"^https?://{_HOST}{_PORT}(?:{_PATH})?$",
    "must be an http:// or https:// URL: a host (a DNS name whose last label starts with a letter, an"
    " IPv4 address or a bracketed IPv6 address), an optional port and path; no credentials, query or"
    " fragment",
)
# The same with a query allowed (an issuer or its key set may live behind one).
HTTP_URL = Syntax(
    rf"^https?://{_HOST}{_PORT}(?:{_PATH})?(?:\?[{_PCHAR}/?.]*)?$",
    "must be an http:// or https:// URL: a host (a DNS name whose last label starts with a letter, an"
    " IPv4 address or a bracketed IPv6 address), an optional port, path and query; no credentials or"
    " fragment",
)
TEXT = Syntax(r"^[^\x00-\x1f\x7f]*$", "must not contain control characters")
# RFC 6749 scope-token characters.
SCOPE = Syntax(
    r"^[\x21\x23-\x5b\x5d-\x7e]+$", "must be a scope token: visible ASCII characters other than '\"' and '\\'"
)
HEADER_NAME = Syntax(
    r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$", "must be a header name: letters, digits and !#$%&'*+.^_`|~-"
)
LOWER_HEADER_NAME = Syntax(
    r"^[a-z0-9!#$%&'*+.^_`|~-]+$", "must be a lower-case header name: a-z, digits and !#$%&'*+.^_`|~-"
)
# A header value as the processing service sets it.
PRINTABLE = Syntax(r"^[\x20-\x7e]*$", "must be printable ASCII text")
JSON_POINTER = Syntax(
    r"^(?:/(?:[\x20-\x2e\x30-\x7d]|~[01])*)+$",
    "must be a JSON pointer (RFC 6901) to a member, such as /a/b, in printable ASCII, with '~' only as"
    " '~0' or '~1'",
)
# "*", an exact origin (a bracketed host is a valid IPv6 address), or any subdomain of a domain of
# at least two labels.
ORIGIN = Syntax(
    rf"^(?:\*|https?://[A-Za-z0-9.-]+{_PORT}|https?://\[{_IPV6}\]{_PORT}"
    rf"|https?://\*(?:\.[A-Za-z0-9-]+){{2,}}{_PORT})$",
    "must be '*', an origin (http:// or https://, a host, an optional port) or http(s)://*. then a domain"
    " of at least two labels",
)
ID = Syntax(
    r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
    "must be 1 to 64 letters, digits, '.', '_' or '-', starting with a letter or a digit",
)
NO_NUL = Syntax(r"^[^\x00]*$", "must not contain a NUL character")
# An OAuth client id.
VISIBLE = Syntax(r"^[\x21-\x7e]+$", "must be visible ASCII characters (no space)")
# The rule an OPA module's decision is read from.
REGO_RULE = Syntax(
    r"^data(?:\.[A-Za-z_][A-Za-z0-9_]*)+$",
    "must name a rule: 'data' then one or more '.name' parts (letters, digits, '_'), such as data.stoa.allow",
)


def _ipv4_networks() -> str:
    """Single IPv4 addresses, and CIDRs whose host bits are zero (a set host bit is refused, never
    silently widened): per prefix length, the octet it cuts may only take multiples of its step."""
    alternatives = [rf"{_IPV4}(?:/32)?"]
    for prefix in range(32):
        whole, bits = divmod(prefix, 8)
        octets = [_OCTET] * whole
        if bits:
            octets.append("(?:" + "|".join(str(v) for v in range(0, 256, 2 ** (8 - bits))) + ")")
        octets += ["0"] * (4 - len(octets))
        alternatives.append(r"\.".join(octets) + f"/{prefix}")
    return "|".join(alternatives)


def _ipv6_networks() -> str:
    """Single IPv6 addresses, and CIDRs written as their leading groups then `::` with a prefix that
    covers those groups (so every host bit is in the `::`)."""
    alternatives = [rf"{_IPV6}(?:/128)?", r"::/(?:[0-9]|[1-9][0-9]|1[01][0-9]|12[0-8])"]
    for groups in range(1, 8):
        lengths = "|".join(str(n) for n in range(16 * groups, 129))
        alternatives.append(rf"(?:{_H16}:){{{groups - 1}}}{_H16}::/(?:{lengths})")
    return "|".join(alternatives)


IP_NETWORK = Syntax(
    rf"^(?:{_ipv4_networks()}|{_ipv6_networks()})$",
    "must be an IPv4 or IPv6 address, or a CIDR range (address/prefix) whose host bits are all zero",
)
