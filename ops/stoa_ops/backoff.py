"""Bounded, fully jittered exponential backoff between reconnect attempts.

Full jitter (a uniform delay in [0, min(cap, base·2^attempt)]) spreads the reconnects of many
clients after a shared outage instead of synchronising them.
"""

from __future__ import annotations

import random


class Backoff:
    """Delays for successive failed attempts; `reset()` after an attempt that worked."""

    def __init__(self, base_s: float = 0.2, cap_s: float = 10.0) -> None:
        if base_s <= 0 or cap_s < base_s:
            raise ValueError("backoff needs 0 < base <= cap")
        self.base_s, self.cap_s = base_s, cap_s
        self.attempt = 0

    def ceiling(self) -> float:
        """The largest delay the next attempt may wait."""
        return min(self.cap_s, self.base_s * 2 ** min(self.attempt, 32))

    def next_delay(self) -> float:
        ceiling = self.ceiling()
        self.attempt += 1
        return random.uniform(0, ceiling)

    def reset(self) -> None:
        self.attempt = 0
