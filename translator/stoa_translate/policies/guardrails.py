"""guardrails → the processing service (`envoy.filters.http.ext_proc`), on the routes it applies to.

The listener's ext_proc filter is inert (every phase skipped: no stream is opened); a guarded route
switches on the phases its direction needs: the buffered request body (when the route only inspects
it, without the request-headers message: its content type, encoding and request id come as
attributes), response headers and the buffered response body (the service turns a server-sent event
stream into streamed mode itself). The rules travel to the service in its policy set
(`stoa.proc.v1.Guardrails`); the route only names itself in the stream's metadata.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass
from typing import Any

import re2
from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from google.protobuf import json_format, struct_pb2
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from stoa_proto import proc_pb2

from stoa_translate.filters import EXT_PROC_FILTER, ext_proc_filter, ext_proc_route
from stoa_translate.policies.kind import ConfigError, PolicyKind

DIRECTIONS = ("request", "response", "both")
PII_KINDS = ("email", "card", "iban", "phone")
PII_ACTIONS = ("block", "redact")
_QUIET = re2.Options()
_QUIET.log_errors = False  # a refused pattern is reported in the refusal, not on stderr


# The characters no reader sees (Unicode's default-ignorable code points: zero-width spaces and
# joiners, the soft hyphen, direction marks, the byte-order mark, variation selectors, tags):
# removed before matching, so that one inside a word does not hide it. RE2: Python's `re` scans a
# class like this one four times slower.
_INVISIBLE = re2.compile(
    "[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u202a-\u202e\u2060-\u206f"
    "\u3164\ufe00-\ufe0f\ufeff\uffa0\ufff0-\ufff8\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0000-\U000e0fff]"
)


def visible(text: str) -> str:
    """`text` without its invisible characters (none in ASCII text: that is checked first, cheaply).
    UnicodeEncodeError for text that is not Unicode (a lone surrogate)."""
    return text if text.isascii() else _INVISIBLE.sub("", text)


def plain(text: str) -> str:
    """Text in its normal form: invisible characters removed, then NFKC."""
    return unicodedata.normalize("NFKC", visible(text))


def folded(text: str) -> str:
    """Text as block patterns and PII kinds see it: `plain`, case-folded (`ß` is `ss`), and a Turkish
    dotted capital I (folded to `i` and a combining dot) read as `i`."""
    text = plain(text).casefold()
    return text.replace("i\u0307", "i") if "\u0307" in text else text


def matcher(pattern: str) -> Any:
    """A block pattern as the processing service matches it (re2.error if it cannot be), in the form
    of the text it meets: invisible characters removed, NFKC, and its non-ASCII characters folded as
    the text is (else `straße` could never match the folded `strasse`); ASCII is left to `(?i)`, since
    folding the syntax would change it (`\\S` is not `\\s`). Checked in this form: NFKC can change a
    pattern's syntax (a full-width parenthesis becomes a parenthesis)."""
    return re2.compile("(?i)" + pattern_form(pattern), _QUIET)


def pattern_form(pattern: str) -> str:
    return "".join(c if c.isascii() else folded(c) for c in plain(pattern))


@dataclass(frozen=True)
class Guardrails:
    policy_id: str
    direction: str
    max_body_bytes: int  # 0 = the service's limit
    block_patterns: tuple[str, ...]
    pii_kinds: tuple[str, ...]
    pii_action: str
    # Canonical JSON text ("" for none): the IR stays hashable.
    json_schema: str

    @property
    def request_buffer_bytes(self) -> int | None:
        """The request body is buffered whole for inspection, up to this limit (0: the default)."""
        return self.max_body_bytes if self.direction in ("request", "both") else None

    @property
    def sends_request_headers(self) -> bool:
        """Whether the service needs the request-headers message: to open the stream when no request
        body is inspected, or because a redaction may rewrite the body (an encoded one is re-sent
        plain, `content-encoding` removed, and Envoy edits only headers the service was sent). A
        route that only inspects reads the type and encoding from the body message's attributes."""
        return self.direction == "response" or self.pii_action == "redact"

    def message(self) -> proc_pb2.Guardrails:
        rules = proc_pb2.Guardrails(
            direction=self.direction, max_body_bytes=self.max_body_bytes, block_patterns=self.block_patterns
        )
        if self.pii_kinds:
            rules.pii.CopyFrom(proc_pb2.PiiRule(kinds=self.pii_kinds, action=self.pii_action))
        if self.json_schema:
            schema = struct_pb2.Struct()
            json_format.Parse(self.json_schema, schema)
            rules.json_schema.CopyFrom(schema)
        return rules


def parse(policy_id: str, config: proc_pb2.Guardrails) -> Guardrails:
    direction = config.direction or "request"
    if direction not in DIRECTIONS:
        raise ConfigError("direction", f"must be one of {', '.join(DIRECTIONS)}")
    patterns = tuple(config.block_patterns)
    for i, pattern in enumerate(patterns):
        try:
            matcher(pattern)
        except re2.error:
            raise ConfigError(f"blockPatterns[{i}]", "is not an RE2 pattern") from None
    kinds = tuple(config.pii.kinds)
    if not all(k in PII_KINDS for k in kinds) or len(set(kinds)) != len(kinds):
        raise ConfigError("pii.kinds", f"must be distinct entries of {', '.join(PII_KINDS)}")
    action = config.pii.action or ("block" if kinds else "")
    if kinds and action not in PII_ACTIONS:
        raise ConfigError("pii.action", f"must be one of {', '.join(PII_ACTIONS)}")
    if action and not kinds:
        raise ConfigError("pii.kinds", "must name at least one kind when an action is given")
    schema = json_format.MessageToDict(config.json_schema) if config.HasField("json_schema") else None
    if schema is not None:
        try:
            Draft202012Validator.check_schema(schema)
        except SchemaError as exc:
            raise ConfigError("jsonSchema", f"is not a valid JSON Schema ({exc.message})") from None
    if not (patterns or kinds or schema or config.max_body_bytes):
        raise ConfigError("", "needs blockPatterns, pii, jsonSchema or maxBodyBytes")
    return Guardrails(
        policy_id=policy_id,
        direction=direction,
        max_body_bytes=config.max_body_bytes,
        block_patterns=patterns,
        pii_kinds=kinds,
        pii_action=action,
        json_schema=json.dumps(schema, sort_keys=True, separators=(",", ":")) if schema else "",
    )


def normalised(rules: Guardrails) -> proc_pb2.Guardrails:
    return rules.message()


def route_config(route_id: str, rules: Guardrails) -> ext_proc_pb2.ExtProcPerRoute:
    request = rules.direction in ("request", "both")
    response = rules.direction in ("response", "both")
    # A declared size over the limit is the buffer filter's 413, before the processor.
    return ext_proc_route(
        route_id,
        request_headers=rules.sends_request_headers,
        request_body=request,
        response_headers=response,
        response_body=response,
    )


KIND = PolicyKind(
    "guardrails",
    EXT_PROC_FILTER,
    proc_pb2.Guardrails,
    parse,
    normalised,
    ext_proc_filter,
    route_config,
    list_limits={"blockPatterns": "patterns"},
)
