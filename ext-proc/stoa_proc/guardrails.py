"""Phase 2, guardrails: the guardrails of one route applied to decoded text.

Text is normalised (NFKC, then case-folded) before anything matches, so full-width letters, ligatures
and case cannot slip a pattern. Patterns are RE2 (linear time: no pattern can backtrack
catastrophically). PII kinds are found by RE2 candidates confirmed by their checksums where they have
one (Luhn for payment cards, mod 97 for IBANs), then blocked or redacted.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import re2
from jsonschema import Draft202012Validator
from stoa_ops.policy_sets import Refused

from stoa_proc.reasons import Deny, Reason

REDACTED = "[redacted]"
_QUIET = re2.Options()
_QUIET.log_errors = False  # a refused pattern is reported in the NACK, not on stderr


def normalise(value: str) -> str:
    return unicodedata.normalize("NFKC", value).casefold()


def _luhn(candidate: str) -> bool:
    digits = [int(c) for c in candidate if c.isdigit()]
    if not 13 <= len(digits) <= 19:
        return False
    total = 0
    for i, digit in enumerate(reversed(digits)):
        if i % 2:
            digit *= 2
            if digit > 9:
                digit -= 9
        total += digit
    return total % 10 == 0


def _iban(candidate: str) -> bool:
    compact = candidate.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    try:
        return int("".join(str(int(c, 36)) for c in rearranged)) % 97 == 1
    except ValueError:
        return False


def _always(_candidate: str) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class PiiKind:
    name: str
    pattern: Any  # re2._Regexp
    confirm: Callable[[str], bool]


# The candidates run on NFKC text, case-insensitively: what they find is then confirmed.
PII_KINDS: dict[str, PiiKind] = {
    kind.name: kind
    for kind in (
        PiiKind(
            "email", re2.compile(r"(?i)[a-z0-9._%+\-]+@[a-z0-9\-]+(?:\.[a-z0-9\-]+)*\.[a-z]{2,}"), _always
        ),
        PiiKind("card", re2.compile(r"\b\d(?:[ \-]?\d){12,18}\b"), _luhn),
        PiiKind(
            "iban", re2.compile(r"(?i)\b[a-z]{2}\d{2}(?: ?[a-z0-9]{4}){2,7}(?: ?[a-z0-9]{1,4})?\b"), _iban
        ),
        # International (+CC …) or North-American grouped numbers; bare digit runs are not phones.
        PiiKind(
            "phone",
            re2.compile(
                r"\+\d{1,3}[ .\-]?(?:\(\d{1,4}\)[ .\-]?)?\d{1,4}(?:[ .\-]?\d{2,4}){2,4}"
                r"|\(\d{3}\)[ .\-]?\d{3}[ .\-]\d{4}"
                r"|\b\d{3}[.\-]\d{3}[.\-]\d{4}\b"
            ),
            _always,
        ),
    )
}


class PolicyError(Refused):
    """A guardrails config that cannot be enforced (the policy set is refused)."""


@dataclass(frozen=True, slots=True)
class Guardrails:
    request: bool
    response: bool
    max_body_bytes: int
    patterns: tuple[Any, ...]
    pii: tuple[PiiKind, ...]
    redact: bool
    schema: Draft202012Validator | None
    # One RE2 alternation of every pattern and blocked PII candidate, multi-line, run once over all the
    # strings of a document (None when a pattern's anchors could make it miss what one string holds).
    screen: Any = None

    def check_texts(self, values: Iterable[str]) -> None:
        """`check_text` on each value. Most documents hold nothing to find: one search of the screen
        over all of them, joined by line breaks, rules that out; only a hit checks each string.

        Sound: what a pattern finds in one string it finds in the joined text (`^` and `$` match at
        each line there, a line break is no word character for `\b`); the screen may find more
        (across strings), which only costs the exact check."""
        strings = list(values)
        if self.screen is not None and not self.screen.search("\n".join(normalise(v) for v in strings)):
            return
        for value in strings:
            self.check_text(value)

    def check_text(self, value: str, *, block_pii: bool = False) -> None:
        """403 if a pattern, or a PII kind to block, is found in the normalised text."""
        folded = normalise(value)
        if any(p.search(folded) for p in self.patterns):
            raise Deny(Reason.GUARDRAIL_BLOCKED)
        if self.pii and (block_pii or not self.redact) and any(_find(k, folded) for k in self.pii):
            raise Deny(Reason.GUARDRAIL_BLOCKED)

    def redact_text(self, value: str) -> str:
        """The text with every confirmed PII match replaced (NFKC form, so what matched is what goes)."""
        if not (self.pii and self.redact):
            return value
        text = unicodedata.normalize("NFKC", value)
        for kind in self.pii:
            text = kind.pattern.sub(lambda m, k=kind: REDACTED if k.confirm(m.group(0)) else m.group(0), text)
        return text

    def check_schema(self, document: Any) -> None:
        if self.schema is None:
            return
        error = next(iter(sorted(self.schema.iter_errors(document), key=lambda e: list(e.path))), None)
        if error is not None:
            raise Deny(Reason.SCHEMA_INVALID, path=error.json_path)


def _find(kind: PiiKind, text: str) -> bool:
    return any(kind.confirm(m.group(0)) for m in kind.pattern.finditer(text))


def _screen(patterns: list[str], blocked_pii: list[PiiKind]) -> Any:
    """The alternation `check_texts` screens a document with, or None when it could not be sound."""
    if any(anchor in p for p in patterns for anchor in ("\\A", "\\z", "-m")):
        return None  # text anchors (or multi-line turned off) mean something else in the joined text
    parts = [unicodedata.normalize("NFKC", p) for p in patterns] + [k.pattern.pattern for k in blocked_pii]
    if not parts:
        return None
    try:
        return re2.compile("(?im)" + "|".join(f"(?:{part})" for part in parts), _QUIET)
    except re2.error:
        return None


def compile_guardrails(
    direction: str,
    max_body_bytes: int,
    patterns: Iterable[str],
    pii_kinds: Iterable[str],
    pii_action: str,
    schema: dict[str, Any] | None,
    default_max_body_bytes: int,
) -> Guardrails:
    if direction not in ("request", "response", "both"):
        raise PolicyError(f"direction {direction!r} is not request, response or both")
    if max_body_bytes < 0:
        raise PolicyError("maxBodyBytes must not be negative")
    compiled = []
    for pattern in patterns:
        try:
            # Case-insensitive on case-folded text (the pattern itself is not folded: `\\S` is not `\\s`).
            compiled.append(re2.compile("(?i)" + unicodedata.normalize("NFKC", pattern), _QUIET))
        except re2.error as exc:
            raise PolicyError(f"blockPatterns: {pattern!r} is not an RE2 pattern: {exc}") from exc
    kinds = []
    for name in pii_kinds:
        if name not in PII_KINDS:
            raise PolicyError(f"pii kind {name!r} is not one of {', '.join(PII_KINDS)}")
        kinds.append(PII_KINDS[name])
    if kinds and pii_action not in ("block", "redact"):
        raise PolicyError(f"pii action {pii_action!r} is not block or redact")
    validator = None
    if schema:
        try:
            Draft202012Validator.check_schema(schema)
        except Exception as exc:
            raise PolicyError(f"jsonSchema is not a valid JSON Schema: {type(exc).__name__}") from exc
        validator = Draft202012Validator(schema)
    limit = min(max_body_bytes or default_max_body_bytes, default_max_body_bytes)
    return Guardrails(
        screen=_screen(list(patterns), kinds if pii_action != "redact" else []),
        request=direction in ("request", "both"),
        response=direction in ("response", "both"),
        max_body_bytes=limit,
        patterns=tuple(compiled),
        pii=tuple(kinds),
        redact=pii_action == "redact",
        schema=validator,
    )
