"""Wait on a condition with a deadline: the only way the harness and its tests wait."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline (an AssertionError so tests fail, not error)."""


class GiveUp(Exception):
    """Raised by a predicate when waiting longer cannot help (the process waited on has exited)."""


def wait_until(
    predicate: Callable[[], T | None],
    timeout: float = 10.0,
    what: str = "condition",
    interval: float = 0.02,
) -> T:
    """Poll `predicate` until it returns a truthy value and return that value.

    Exceptions raised by the predicate count as "not yet" (a server that is still starting refuses
    connections); the last one is reported if the deadline passes. `GiveUp` ends the wait at once.
    """
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last_error = None
        except GiveUp:
            raise
        except Exception as exc:  # the predicate decides what "not yet" looks like
            last_error = exc
        if time.monotonic() >= deadline:
            cause = f" (last error: {last_error!r})" if last_error else ""
            raise WaitTimeout(f"timed out after {timeout:.1f}s waiting for {what}{cause}")
        time.sleep(interval)
