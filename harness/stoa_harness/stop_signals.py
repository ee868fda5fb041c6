"""Stop signals (SIGINT, SIGTERM, SIGHUP) for a launcher that must always get to its teardown.

A Python signal handler runs in the main thread between any two bytecodes, including inside another
handler or inside a lock's critical section; one that takes a lock (`threading.Event.set` does) can
deadlock against the code it interrupted. So the handler here only sets attributes, and the signal
also wakes the main loop through `signal.set_wakeup_fd` (written by the interpreter's C-level
handler), where everything else happens. Any number of signals, in any rhythm, leads to one stop.

While the launcher is still starting there is no loop to wake: the first signal raises
`StopRequested` in the main thread, which unwinds the start-up (stopping what it had started); later
signals only note themselves.

    with StopSignals() as stop:
        start_everything()            # a signal here raises StopRequested
        stop.serving = True
        while not stop.wait(0.5):     # True once a stop signal arrived
            supervise()
    # teardown: further signals change nothing
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from types import FrameType, TracebackType
from typing import Any, Self

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(BaseException):
    """A stop signal arrived while the launcher was still starting. A BaseException, as
    KeyboardInterrupt is: code that retries on any Exception (a readiness poll) must not swallow it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        super().__init__(f"stopped by {signal.Signals(signum).name} during start-up")


class StopSignals:
    def __init__(self) -> None:
        self.requested: int | None = None  # the first stop signal's number
        self.serving = False  # set by the owner once its main loop runs
        self._read_fd = self._write_fd = -1
        self._previous: dict[int, Any] = {}
        self._previous_wakeup_fd = -1

    def __enter__(self) -> Self:
        self._read_fd, self._write_fd = os.pipe()
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self._write_fd, False)
        self._previous_wakeup_fd = signal.set_wakeup_fd(self._write_fd, warn_on_full_buffer=False)
        self._previous = {signum: signal.signal(signum, self._on_signal) for signum in SIGNALS}
        return self

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        # Attribute assignments only (see the module's docstring).
        first = self.requested is None
        if first:
            self.requested = signum
        if first and not self.serving:
            raise StopRequested(signum)

    def wait(self, timeout: float) -> bool:
        """Block up to `timeout` seconds or until a stop signal arrives; whether one has."""
        if self.requested is None:
            with contextlib.suppress(InterruptedError):
                select.select([self._read_fd], [], [], timeout)
            with contextlib.suppress(BlockingIOError):
                os.read(self._read_fd, 512)  # the signal numbers written: only the wake-up matters
        return self.requested is not None

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        signal.set_wakeup_fd(self._previous_wakeup_fd)
        os.close(self._read_fd)
        os.close(self._write_fd)
