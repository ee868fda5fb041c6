"""Phase 2, guardrails: the guardrails of one route applied to decoded text.

Text is normalised (invisible characters removed, NFKC, then case-folded) before anything matches, so
zero-width characters, full-width letters, ligatures and case cannot slip a pattern. Patterns are
RE2 (linear time: no pattern can backtrack catastrophically). PII kinds are found by RE2 candidates
confirmed by their checksums where they have one (Luhn and an industry digit for payment cards, mod 97
for IBANs), then
blocked or redacted.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import re2
from jsonschema import Draft202012Validator
from stoa_proto import proc_pb2
from stoa_translate.policies import guardrails as guardrails_kind

from stoa_proc.reasons import Deny, Reason
from stoa_proc.rules import translated

REDACTED = "[redacted]"
_QUIET = re2.Options()
_QUIET.log_errors = False  # a screen that cannot be built is done without, not reported


# What every pattern and PII kind matches on (the translator's one definition).
normalise = guardrails_kind.folded


# How a payment card's number starts: a major industry digit of the card schemes (2 to 6: Mastercard,
# American Express, Diners, JCB, Visa, Discover, UnionPay, Maestro), or a scheme's own prefix outside
# them (RuPay 81, 82; UzCard 8600; Troy 9792; Humo 9860), or UATP's 1 with 15 digits. Numbers starting
# otherwise (epoch-millisecond times, 13 digits from 1; most numeric ids) are not cards, though a tenth
# pass Luhn.
_CARD_INDUSTRIES = frozenset("23456")
_CARD_PREFIXES = ("81", "82", "8600", "9792", "9860")


def _card_start(number: str) -> bool:
    return (
        number[0] in _CARD_INDUSTRIES
        or number.startswith(_CARD_PREFIXES)
        or (number[0] == "1" and len(number) == 15)
    )


def _card(candidate: str) -> bool:
    number = "".join(c for c in candidate if c.isdigit())
    if not 13 <= len(number) <= 19 or not _card_start(number):
        return False
    digits = [int(c) for c in number]
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
        # Digits apart by up to three spaces, tabs or dashes each ("4111  1111 ..." is still a card).
        PiiKind("card", re2.compile(r"\b\d(?:[ \t\-]{0,3}\d){12,18}\b"), _card),
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

    def check_texts(self, values: Sequence[str], *, block_pii: bool = False) -> None:
        """`check_text` on each value. Most documents hold nothing to find: one search of the screen
        over all of them, joined by line breaks, rules that out; only a hit checks each string.

        Sound: what a pattern finds in one string it finds in the joined text (`^` and `$` match at
        each line there, a line break is no word character for `\b`); the screen may find more
        (across strings), which only costs the exact check."""
        # One normalisation of the joined text is that of each string: a line break composes with
        # nothing, and case folding goes character by character.
        # The screen leaves out the PII kinds a redaction takes care of: blocked here, it cannot rule.
        screened = self.screen is not None and not (block_pii and self.redact)
        with _decodable:
            if screened and not self.screen.search(normalise("\n".join(values))):
                return
        for value in values:
            self.check_text(value, block_pii=block_pii)

    def check_text(self, value: str, *, block_pii: bool = False) -> None:
        """403 if a pattern, or a PII kind to block, is found in the normalised text."""
        with _decodable:
            folded = normalise(value)
            if any(p.search(folded) for p in self.patterns):
                raise Deny(Reason.GUARDRAIL_BLOCKED)
            if self.pii and (block_pii or not self.redact) and any(_find(k, folded) for k in self.pii):
                raise Deny(Reason.GUARDRAIL_BLOCKED)

    def redact_text(self, value: str) -> str:
        """The text with every confirmed PII match replaced, the rest as it was. PII that only the
        text's normal form shows (split by invisible characters, in full-width digits) is replaced in
        that form, and the text is then sent in it (NFKC, invisible characters removed)."""
        if not (self.pii and self.redact):
            return value
        text = self._replaced(value)
        with _decodable:
            # A text already in its normal form hides nothing the replacement did not see.
            normal = guardrails_kind.plain(value)
            if normal != value and any(_find(kind, normalise(text)) for kind in self.pii):
                text = self._replaced(normal)
        return text

    def _replaced(self, text: str) -> str:
        """`text` with each confirmed match of the PII kinds replaced."""
        for kind in self.pii:

            def replace(match: Any, kind: PiiKind = kind) -> str:
                return REDACTED if kind.confirm(match.group(0)) else match.group(0)

            with _decodable:
                text = kind.pattern.sub(replace, text)
        return text

    def check_schema(self, document: Any) -> None:
        if self.schema is None:
            return
        error = next(iter(sorted(self.schema.iter_errors(document), key=lambda e: list(e.path))), None)
        if error is not None:
            raise Deny(Reason.SCHEMA_INVALID, path=error.json_path)


class _Decodable:
    """Text that is not Unicode (a lone surrogate, from a JSON `\\ud800` escape) is an undecodable
    body (400), found where RE2 needs the text as UTF-8: only then does it cost anything (a class:
    a generator's context manager costs microseconds on every check)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, _tb: object) -> bool:
        if kind is not None and issubclass(kind, UnicodeEncodeError):
            raise Deny(Reason.MALFORMED_BODY) from exc
        return False


_decodable = _Decodable()


def _find(kind: PiiKind, text: str) -> bool:
    return any(kind.confirm(m.group(0)) for m in kind.pattern.finditer(text))


def _screen(patterns: list[str], blocked_pii: list[PiiKind]) -> Any:
    """The alternation `check_texts` screens a document with, or None when it could not be sound."""
    if any(anchor in p for p in patterns for anchor in ("\\A", "\\z", "-m")):
        return None  # text anchors (or multi-line turned off) mean something else in the joined text
    parts = [guardrails_kind.pattern_form(p) for p in patterns] + [k.pattern.pattern for k in blocked_pii]
    if not parts:
        return None
    try:
        return re2.compile("(?im)" + "|".join(f"(?:{part})" for part in parts), _QUIET)
    except re2.error:
        return None


def compile_guardrails(config: proc_pb2.Guardrails, default_max_body_bytes: int) -> Guardrails:
    """The runtime matchers of a route's guardrails, in the translator's normal form (else PolicyError)."""
    rules = translated(guardrails_kind.KIND, config)
    kinds = [PII_KINDS[name] for name in rules.pii_kinds]
    schema = json.loads(rules.json_schema) if rules.json_schema else None
    limit = min(rules.max_body_bytes or default_max_body_bytes, default_max_body_bytes)
    return Guardrails(
        screen=_screen(list(rules.block_patterns), kinds if rules.pii_action != "redact" else []),
        request=rules.direction in ("request", "both"),
        response=rules.direction in ("response", "both"),
        max_body_bytes=limit,
        patterns=tuple(guardrails_kind.matcher(p) for p in rules.block_patterns),
        pii=tuple(kinds),
        redact=rules.pii_action == "redact",
        schema=Draft202012Validator(schema) if schema is not None else None,
    )
