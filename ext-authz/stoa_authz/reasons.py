"""The closed set of decision reasons (shared with the translator through `stoa_proto.decisions`)
and the exception a phase raises to end a decision with one of them."""

from __future__ import annotations

from collections.abc import Sequence

from stoa_proto.decisions import DENIALS, Reason

__all__ = ["DENIALS", "Deny", "Reason"]


class Deny(Exception):
    """Raised by a phase to end the decision with a denial."""

    def __init__(self, reason: Reason, headers: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(reason.value)
        self.reason = reason
        # Headers of this denial only (a quota's Retry-After and RateLimit fields).
        self.headers = tuple(headers)
