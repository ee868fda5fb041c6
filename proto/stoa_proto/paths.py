"""The path rule shared by Envoy's routes and the authorization service: no hidden dot segment.

Envoy resolves `.` and `..` segments it recognises (RFC 3986, `%2e` included, and `..;`) before it
routes, so the route, the decision and the upstream see one path. What it does not recognise — a
segment that becomes `.` or `..` only once a server percent-decodes it (possibly twice) and drops its
`;parameters` — would let a server resolve it differently from the route that authorised it
(`/pub/%2e%2e;/admin`, served by Tomcat as `/admin`). Such a path is refused with 400.

The rule is derived, not listed: `encoded(c, depth)` is every spelling of the character `c` that
percent-decoding turns into `c` within `depth` decodings, any letter case in the escapes (a `%` may
itself be written `%25`, each hex digit `%3X`, `%4X` or `%6X`). A refused path holds a separator
(`/` or `\\`, as spelled above), then one or two dots (as spelled above), then the end of the path, or
a `;`, a separator or any escape (a `%`, which may decode to either). `DEPTH` is 2: what Envoy
forwards may be decoded once by the upstream's server and once more by its framework.

RE2 (Envoy) and Python's `re` read the pattern alike; it is matched against the whole path without
its query string. Envoy refuses RE2 programs above 100 instructions by default; this one is below.
"""

from __future__ import annotations

import re

DEPTH = 2


def _hex_digit(digit: str, depth: int) -> str:
    """A hex digit (either letter case) within `depth` decodings."""
    literal = f"[{digit}{digit.upper()}]" if digit.isalpha() else digit
    if depth == 0:
        return literal
    cases = sorted({digit, digit.upper()})
    return f"(?:{literal}|{'|'.join(_escape(c, depth - 1) for c in cases)})"


def _escape(char: str, depth: int) -> str:
    """`%XY` for `char`, each of its three characters itself within `depth` decodings."""
    high, low = f"{ord(char):02x}"
    return _percent(depth) + _hex_digit(high, depth) + _hex_digit(low, depth)


def _percent(depth: int) -> str:
    return "%" if depth == 0 else f"(?:%|{_escape('%', depth - 1)})"


def encoded(char: str, depth: int) -> str:
    """A regular expression for every spelling of `char` within `depth` percent-decodings."""
    literal = re.escape(char)
    return literal if depth == 0 else f"(?:{literal}|{_escape(char, depth - 1)})"


def dot_segment_pattern(depth: int = DEPTH) -> str:
    separator = f"(?:{encoded('/', depth)}|{encoded(chr(92), depth)})"
    dot = encoded(".", depth)
    return f".*{separator}{dot}{dot}?(?:[;/\\\\%].*)?"


HIDDEN_DOT_SEGMENT = dot_segment_pattern()
_HIDDEN = re.compile(HIDDEN_DOT_SEGMENT)


def has_hidden_dot_segment(path: str) -> bool:
    """`path` as Envoy forwards it (normalised), with or without its query string."""
    return _HIDDEN.fullmatch(path.partition("?")[0]) is not None
