"""Reconnect backoff: every delay within its bound, the bound doubling up to the cap, reset after success."""

from __future__ import annotations

import pytest
from stoa_ops.backoff import Backoff


def test_backoff_is_bounded_full_jitter() -> None:
    backoff = Backoff(base_s=0.2, cap_s=10.0)
    delays = [backoff.next_delay() for _ in range(200)]
    for attempt, delay in enumerate(delays):
        assert 0 <= delay <= min(10.0, 0.2 * 2**attempt)
    assert max(delays[10:]) > 1.0, "the ceiling grows to the cap"
    assert len(set(delays)) > 150, "jittered, not a fixed schedule"
    backoff.reset()
    assert backoff.ceiling() == 0.2
    assert backoff.next_delay() <= 0.2


@pytest.mark.parametrize(("base", "cap"), [(0, 1), (-1, 1), (2, 1)])
def test_nonsense_bounds_are_refused(base: float, cap: float) -> None:
    with pytest.raises(ValueError, match="0 < base <= cap"):
        Backoff(base, cap)
