"""The syntax of the API's text fields, as the regular expressions the OpenAPI document publishes.

Each pattern is enforced as published (a value that does not match is refused), and every value
that matches also passes the site's own rule for the field (`stoa_translate.fields` and the policy
kinds), so a request that fits the schema is never refused for its syntax. Where a rule is wider
than a regular expression can say exactly (an IPv6 range in every textual form, say), the pattern
keeps to a part of it that covers the usual spellings.
"""

from __future__ import annotations

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

PATH = rf"^{_PATH}$"
# http(s)://host[:port][/path]: no credentials, query or fragment.
UPSTREAM_URL = rf"^https?://{_HOST}{_PORT}(?:{_PATH})?$"
# The same with a query allowed (an issuer or its key set may live behind one).
HTTP_URL = rf"^https?://{_HOST}{_PORT}(?:{_PATH})?(?:\?[{_PCHAR}/?.]*)?$"
# Text without control characters.
TEXT = r"^[^\x00-\x1f\x7f]*$"
SCOPE = r"^[\x21\x23-\x5b\x5d-\x7e]+$"  # RFC 6749 scope-token characters
HEADER_NAME = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
LOWER_HEADER_NAME = r"^[a-z0-9!#$%&'*+.^_`|~-]+$"
# Printable ASCII (a header value as the processing service sets it).
PRINTABLE = r"^[\x20-\x7e]*$"
# A JSON pointer (RFC 6901) to a member, in printable ASCII: "~" only as "~0" or "~1".
JSON_POINTER = r"^(?:/(?:[\x20-\x2e\x30-\x7d]|~[01])*)+$"
# "*", an exact origin (a bracketed host is a valid IPv6 address), or any subdomain of a domain of
# at least two labels.
ORIGIN = (
    rf"^(?:\*|https?://[A-Za-z0-9.-]+{_PORT}|https?://\[{_IPV6}\]{_PORT}"
    rf"|https?://\*(?:\.[A-Za-z0-9-]+){{2,}}{_PORT})$"
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


IP_NETWORK = rf"^(?:{_ipv4_networks()}|{_ipv6_networks()})$"
