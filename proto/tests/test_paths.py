"""The hidden-dot-segment rule against a reference: decode up to DEPTH times, split, drop parameters."""

from __future__ import annotations

import itertools
import random
import re
from urllib.parse import unquote

import pytest
from stoa_proto.paths import DEPTH, has_hidden_dot_segment, is_refused


def resolves_to_dot_segment(path: str) -> bool:
    """What a server that decodes `DEPTH` times and drops `;parameters` would call a dot segment."""
    for _ in range(DEPTH + 1):
        for segment in re.split(r"[/\\]", path)[1:]:
            if segment.split(";", 1)[0] in (".", ".."):
                return True
        path = unquote(path)
    return False


@pytest.mark.parametrize("suffix", ["", "/x", ";", ";v=1/x", "%3b/x", "%253B", "%2f", "%255cx"])
def test_every_spelling_of_a_dot_segment_is_refused(suffix: str) -> None:
    dots = ["%2e", "%2E", "%252e", "%252E", "%%32%65", "%25%32%45", "%2%65", "%2%45", "%25%32%65"]
    for one, two in itertools.product([*dots, "."], repeat=2):
        for segment in (one, one + two):
            path = f"/p/{segment}{suffix}"
            if segment in (".", "..") and suffix in ("", "/x"):
                continue  # Envoy resolves these itself before anything sees the path
            assert has_hidden_dot_segment(path), path


def test_the_rule_misses_nothing_a_double_decoding_server_would_resolve() -> None:
    rng = random.Random(7)
    alphabet = [".", "%", "2", "5", "e", "E", "3", "b", "B", "f", "/", ";", "a", "6", "4"]
    checked = 0
    for _ in range(60_000):
        segment = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
        path = f"/p/{segment}/x"
        if resolves_to_dot_segment(path):
            checked += 1
            literal = any(s.split(";", 1)[0] in (".", "..") for s in path.split("/")[1:])
            # Literal dot segments are Envoy's to resolve; only the hidden ones reach the rule.
            assert literal or has_hidden_dot_segment(path), path
    assert checked > 100


@pytest.mark.parametrize(
    "path",
    [
        "/a;v=1/b",
        "/files/report.v2.pdf",
        "/.well-known/jwks.json",
        "/a/.../b",
        "/a/...;/b",
        "/a/x..;/b",
        "/a/%25/b",
        "/a/%E2%82%AC",
        "/a/b?c=/%2e%2e;/",
        "/a/.hidden",
        "/a/%25252e/b",
    ],
)
def test_ordinary_paths_pass(path: str) -> None:
    assert not has_hidden_dot_segment(path)
    assert not is_refused(path)


def lax_decode(text: str) -> str:
    """What a lax server makes of escapes that are not percent-encoded UTF-8: IIS's `%uXXXX`, and
    overlong UTF-8 sequences read as the character they spell (the bytes' payload bits)."""
    text = re.sub(r"%[uU]([0-9a-fA-F]{4})", lambda m: chr(int(m[1], 16)), text)

    def overlong(match: re.Match[str]) -> str:
        raw = bytes.fromhex(match[0].replace("%", ""))
        value = raw[0] & (0x3F >> (len(raw) - 1))
        for byte in raw[1:]:
            value = (value << 6) | (byte & 0x3F)
        return chr(value) if value < 0x80 else match[0]

    lead = r"%(?:[cC][01]|[eE]0%[89aA][0-9a-fA-F]|[fF]0%8[0-9a-fA-F]%[89aA][0-9a-fA-F])"
    return re.sub(rf"{lead}%[89aAbB][0-9a-fA-F]", overlong, text)


def test_a_foreign_escape_of_a_dot_or_separator_is_refused_wherever_it_is() -> None:
    rng = random.Random(11)
    tokens = [
        *("%u002e", "%U002F", "%u005C", "%c0%ae", "%C0%AF", "%c1%9c", "%e0%80%ae", "%E0%80%AF"),
        *("%f0%80%80%ae", "%f0%80%81%9c", "%25u002e", "%25c0%25ae", "%25E0%2580%25af"),
        *("a", ".", "/", ";", "%41", "%c3%a9", "%u0041", "%e0%a0%80"),
    ]
    refused = 0
    for _ in range(20_000):
        path = "/p/" + "".join(rng.choice(tokens) for _ in range(rng.randint(1, 5)))
        for once in {path, unquote(path)}:  # its `%` may itself be escaped
            if sum(lax_decode(once).count(c) for c in "./\\") > sum(once.count(c) for c in "./\\"):
                refused += 1
                assert is_refused(path), path
                break
        else:  # refused only by the dot-segment rule (one or two dots, then an escape), if at all
            assert not is_refused(path) or has_hidden_dot_segment(path), path
    assert refused > 1000


@pytest.mark.parametrize(
    "path",
    ["/a/%u0041", "/a/%c3%a9", "/a/%E2%82%AC", "/a/%e0%a0%80", "/a/%F0%9F%98%80", "/a/%25", "/a/b?x=%u002e"],
)
def test_escapes_of_other_characters_pass(path: str) -> None:
    assert not is_refused(path)
