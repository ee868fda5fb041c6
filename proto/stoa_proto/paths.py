"""The path rules shared by Envoy's routes and the authorization service: no hidden dot segment, and
no foreign escape (`foreign_escape_pattern`: a `.`, `/` or `\\` in an encoding that is not
percent-encoded UTF-8, which lax servers decode anyway).

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


def _hex_digits(value: int) -> list[str]:
    return [f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{value:02x}"]


def _alternation(spellings: list[list[str]]) -> str:
    """One regular expression for several token sequences, their common beginnings shared (a trie):
    the same language, a smaller RE2 program."""
    trie: dict[str, dict] = {}
    for tokens in spellings:
        node = trie
        for token in tokens:
            node = node.setdefault(token, {})
        node[""] = {}

    def render(node: dict[str, dict]) -> str:
        branches = [token + render(child) for token, child in node.items() if token]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else f"(?:{'|'.join(branches)})"
        if "" in node:  # a sequence ends here while longer ones go on: the rest is optional
            return f"(?:{body})?" if len(branches) == 1 else f"{body}?"
        return body

    return render(trie)


def foreign_escape_pattern() -> str:
    """A `.`, `/` or `\\` written as an escape that is not percent-encoded UTF-8 but that some servers
    decode anyway: IIS's `%uXXXX`, and overlong UTF-8 (two, three or four bytes for one ASCII
    character) that lax decoders read as that character. No conforming client writes one, and a server
    that decodes it may resolve a dot segment or a separator the route never saw, so a path holding
    one anywhere (its `%` possibly written `%25`, any letter case) is refused."""
    percent = _percent(1)
    spellings = []
    for char in "./\\":
        code = ord(char)
        low = 0x80 | (code & 0x3F)
        spellings.append(["[uU]", *_hex_digits(0), *_hex_digits(code)])
        # Overlong: the character's bits spread over more bytes than UTF-8 allows.
        for lead in ((0xC0 | (code >> 6),), (0xE0, 0x80 | (code >> 6)), (0xF0, 0x80, 0x80 | (code >> 6))):
            tokens: list[str] = []
            for byte in (*lead, low):
                tokens += [percent] if tokens else []
                tokens += _hex_digits(byte)
            spellings.append(tokens)
    return f".*{percent}{_alternation(spellings)}.*"


HIDDEN_DOT_SEGMENT = dot_segment_pattern()
FOREIGN_ESCAPE = foreign_escape_pattern()
# Every rule a path is refused by, each its own RE2 program (Envoy: one route entry each, each under
# the program-size limit); the authorization service applies the same.
REFUSED_PATHS = (HIDDEN_DOT_SEGMENT, FOREIGN_ESCAPE)
_HIDDEN = re.compile(HIDDEN_DOT_SEGMENT)
_REFUSED = tuple(re.compile(pattern) for pattern in REFUSED_PATHS)


def has_hidden_dot_segment(path: str) -> bool:
    """`path` as Envoy forwards it (normalised), with or without its query string."""
    return _HIDDEN.fullmatch(path.partition("?")[0]) is not None


def is_refused(path: str) -> bool:
    """Whether `path` (as Envoy forwards it, with or without its query string) is refused: a hidden
    dot segment or a foreign escape."""
    bare = path.partition("?")[0]
    return any(rule.fullmatch(bare) is not None for rule in _REFUSED)
