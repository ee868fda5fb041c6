"""Wait on a condition with a deadline: the only way the harness and its tests wait."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """The condition did not hold before the deadline (an AssertionError so tests fail, not error)."""


class GiveUp(Exception):
    """Raised by a predicate when waiting longer cannot help (the process waited on has exited)."""


class _Poll:
    """The deadline and last error of one wait, shared by the sync and async loops."""

    def __init__(self, timeout: float, what: str) -> None:
        self.timeout = timeout
        self.what = what
        self.deadline = time.monotonic() + timeout
        self.last_error: Exception | None = None

    def note(self, error: Exception | None) -> None:
        """Record an attempt's outcome: a predicate's exception counts as "not yet", but GiveUp ends it."""
        if isinstance(error, GiveUp):
            raise error
        self.last_error = error

    def check(self) -> None:
        if time.monotonic() >= self.deadline:
            cause = f" (last error: {self.last_error!r})" if self.last_error else ""
            raise WaitTimeout(f"timed out after {self.timeout:.1f}s waiting for {self.what}{cause}")


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
    poll = _Poll(timeout, what)
    while True:
        try:
            value = predicate()
        except Exception as exc:  # the predicate decides what "not yet" looks like
            poll.note(exc)
        else:
            if value:
                return value
            poll.note(None)
        poll.check()
        time.sleep(interval)


async def wait_until_async(
    predicate: Callable[[], Awaitable[T | None] | T | None],
    # A deadline of our own, not asyncio.timeout: it reports the predicate's last error.
    timeout: float = 10.0,  # noqa: ASYNC109
    what: str = "condition",
    interval: float = 0.02,
) -> T:
    """`wait_until` for code on an event loop, where a sync wait would block the servers it runs.

    The predicate may be a plain or an async callable; the rules are those of `wait_until`.
    """
    poll = _Poll(timeout, what)
    while True:
        try:
            value = predicate()
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:  # the predicate decides what "not yet" looks like
            poll.note(exc)
        else:
            if value:
                return value  # type: ignore[return-value]
            poll.note(None)
        poll.check()
        await asyncio.sleep(interval)
