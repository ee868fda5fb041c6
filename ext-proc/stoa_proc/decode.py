"""Phase 1, decode: a body as sent → the text and JSON document that inspection reads.

Content encodings (gzip, br, zstd, in the order applied) are undone for inspection only, with a cap
on the decoded size and on the expansion ratio, so a decompression bomb is refused (413) before it
is inflated. The text must be UTF-8; JSON must parse without duplicate keys (two parsers could
otherwise disagree on which value counts).
"""

from __future__ import annotations

import codecs
import json
import re
import zlib
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote_plus

import brotli
import zstandard
from stoa_proto.bodies import media_type

from stoa_proc.reasons import Deny, Reason

_CHUNK = 64 * 1024


@dataclass(frozen=True, slots=True)
class Limits:
    max_bytes: int
    max_ratio: int


def _gunzip(data: bytes, cap: int) -> bytes:
    # wbits 47: gzip or zlib header, detected.
    inflater = zlib.decompressobj(wbits=47)
    out = inflater.decompress(data, cap + 1)
    if len(out) > cap:
        raise Deny(Reason.TOO_LARGE)
    if not inflater.eof:
        raise Deny(Reason.MALFORMED_BODY)
    return out


def _unbrotli(data: bytes, cap: int) -> bytes:
    inflater = brotli.Decompressor()
    parts: list[bytes] = []
    size = 0
    chunk = inflater.process(data, output_buffer_limit=_CHUNK)
    while True:
        parts.append(chunk)
        size += len(chunk)
        if size > cap:
            raise Deny(Reason.TOO_LARGE)
        if inflater.is_finished() or (not chunk and inflater.can_accept_more_data()):
            break
        chunk = inflater.process(b"", output_buffer_limit=_CHUNK)
    if not inflater.is_finished():
        raise Deny(Reason.MALFORMED_BODY)
    return b"".join(parts)


def _unzstd(data: bytes, cap: int) -> bytes:
    reader = zstandard.ZstdDecompressor().stream_reader(data, read_across_frames=True)
    out = reader.read(cap + 1)
    if len(out) > cap:
        raise Deny(Reason.TOO_LARGE)
    return out


_DECODERS = {"gzip": _gunzip, "x-gzip": _gunzip, "br": _unbrotli, "zstd": _unzstd}


def encodings(header: str) -> list[str]:
    return [e.strip().lower() for e in header.split(",") if e.strip() and e.strip().lower() != "identity"]


def decompress(body: bytes, content_encoding: str, limits: Limits) -> bytes:
    """The body with every listed encoding undone (last applied first); 413 past the limits, 400 for
    an unknown encoding or a corrupt stream."""
    data = body
    for name in reversed(encodings(content_encoding)):
        decoder = _DECODERS.get(name)
        if decoder is None:
            raise Deny(Reason.MALFORMED_BODY)
        cap = min(limits.max_bytes, max(len(data), 1) * limits.max_ratio)
        try:
            data = decoder(data, cap)
        except (zlib.error, brotli.error, zstandard.ZstdError) as exc:
            raise Deny(Reason.MALFORMED_BODY) from exc
    return data


def text(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Deny(Reason.MALFORMED_BODY) from exc


# Charsets whose text is the UTF-8 text already inspected.
_UTF8_VIEWS = frozenset(("utf-8", "ascii"))


def declared_text(content_type: str, data: bytes) -> str | None:
    """The body as its declared charset reads it, when that is not UTF-8 (an upstream that honours
    `charset=utf-16le` or `utf-7` reads other words than the UTF-8 view shows), else None; 400 for a
    charset Python does not know, a body it cannot decode, or a charset named twice (parsers disagree on
    which one counts)."""
    charsets = [
        value.strip().strip('"').lower()
        for name, _, value in (parameter.partition("=") for parameter in content_type.split(";")[1:])
        if name.strip().lower() == "charset"
    ]
    if len(charsets) > 1:
        raise Deny(Reason.MALFORMED_BODY)
    charset = charsets[0] if charsets else ""
    if not charset:
        return None
    try:
        codec = codecs.lookup(charset).name
    except LookupError as exc:
        raise Deny(Reason.MALFORMED_BODY) from exc
    if codec in _UTF8_VIEWS:
        return None
    try:
        return data.decode(codec)
    except (LookupError, ValueError) as exc:  # not a text encoding (`base64`), or not decodable
        raise Deny(Reason.MALFORMED_BODY) from exc


class DuplicateKey(ValueError):
    pass


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise DuplicateKey("duplicate key")
    return document


def _finite(value: str) -> Any:
    raise ValueError(f"not a JSON number: {value}")


# One decoder for every document: `json.loads` with hooks builds a decoder and its scanner per call.
_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_finite)


def parse_json(source: str) -> Any:
    """The JSON document, `\\u` escapes decoded; 400 for duplicate keys, NaN/Infinity or bad JSON."""
    try:
        return _DECODER.decode(source)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError and DuplicateKey are ValueErrors
        raise Deny(Reason.MALFORMED_BODY) from exc


# What `sniffed_json` gives for a text that is not JSON (`None` is the JSON document `null`).
NOT_JSON: Any = object()


def sniffed_json(source: str) -> Any:
    """The JSON document a text holds whatever it is labelled (a streamed event, a body a client did
    not declare JSON but an upstream may parse as JSON), or NOT_JSON; 400 for duplicate keys (two
    parsers could read two different values, as in a JSON body)."""
    try:
        return _DECODER.decode(source)
    except DuplicateKey as exc:
        raise Deny(Reason.MALFORMED_BODY) from exc
    except (ValueError, RecursionError):
        return NOT_JSON


_ESCAPE = re.compile(r"\\u([0-9a-fA-F]{4})")


def unescape(text: str) -> str:
    """`\\uXXXX` escapes in plain text decoded, so an escaped word is inspected as the word; an escaped
    surrogate pair is its one character, a lone surrogate U+FFFD (this text is only matched)."""
    if "\\u" not in text:
        return text
    decoded = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), text)
    return decoded.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace")


def form_decoded(content_type: str, text: str) -> str | None:
    """A form body's text as the upstream reads it (percent-escapes and `+` decoded), or None when the
    body is not a form or holds nothing encoded."""
    if media_type(content_type) != "application/x-www-form-urlencoded":
        return None
    decoded = unquote_plus(text)
    return decoded if decoded != text else None


def decoded_views(content_type: str, text: str) -> list[str]:
    """The text as an upstream may decode it, where that differs: its `\\u` escapes, a form body's
    escapes, and the escapes inside a form's values."""
    views = []
    unescaped = unescape(text)
    if unescaped != text:
        views.append(unescaped)
    form = form_decoded(content_type, text)
    if form is not None:
        views.append(form)
        if (inner := unescape(form)) != form:
            views.append(inner)
    return views


def is_json(content_type: str) -> bool:
    media = media_type(content_type)
    return media == "application/json" or media.endswith("+json")


# A number is inspected as text from this size on: a card number sent as a number is still one, and
# the digits of a fraction (a probability, a score) are no identifier of anything.
_NUMBER_AS_TEXT = 10**12


def number_text(node: object) -> str | None:
    """A JSON number as the digits an identifier would be written with (`4111111111111111` for
    4111111111111111 and for 4.111111111111111e15), or None: not a number, a fraction or too small."""
    if isinstance(node, bool) or not isinstance(node, int | float):
        return None
    if isinstance(node, float) and not node.is_integer():
        return None
    return str(int(node)) if abs(node) >= _NUMBER_AS_TEXT else None


def strings(document: Any) -> list[str]:
    """Every string of a JSON document, object keys included, and every whole number of 13 digits or
    more as text (`number_text`), depth first (a list: a generator's resumption per string costs more
    than the rest of the walk)."""
    found: list[str] = []
    stack = [document]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            found.append(node)
        elif isinstance(node, int | float) and not isinstance(node, bool):
            if (digits := number_text(node)) is not None:
                found.append(digits)
        elif isinstance(node, dict):
            for key, value in node.items():
                found.append(key)
                stack.append(value)
        elif isinstance(node, list):
            stack.extend(node)
    return found
