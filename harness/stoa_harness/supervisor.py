"""Restarting crashed processes, as a site's process manager would: a process that exits although
nobody stopped it is started again after a delay that doubles with each quick crash (up to a bound)
and goes back to the first delay once the process has stayed up for a while.

The owner calls `tick()` from its own loop (no thread, no lock: `stoa-estate run` calls it from its
main loop, between waits for a stop signal); a restart does not wait for the process to be ready, so
a tick is quick and a stop is never held up by a slow start.

    supervisor = Supervisor([cp, link, authz, envoy], log=print)
    while not stopping:
        if supervisor.tick():                       # True when something was restarted
            publish(supervisor.status())            # {"authz": {"pid": ..., "running": ..., "restarts": 1}}
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from stoa_harness.processes import SupervisedProcess

FIRST_DELAY_S = 0.5
MAX_DELAY_S = 30.0
STABLE_AFTER_S = 30.0


@dataclass
class _Watched:
    process: SupervisedProcess
    restarts: int = 0
    delay_s: float = FIRST_DELAY_S
    up_since: float = field(default_factory=time.monotonic)
    retry_at: float | None = None  # set while a crashed process waits for its restart


def exit_description(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    return f"killed by signal {-returncode}" if returncode < 0 else f"exit code {returncode}"


class Supervisor:
    def __init__(
        self,
        processes: Sequence[SupervisedProcess],
        *,
        log: Callable[[str], None],
        first_delay_s: float = FIRST_DELAY_S,
        max_delay_s: float = MAX_DELAY_S,
        stable_after_s: float = STABLE_AFTER_S,
    ) -> None:
        self.first_delay_s = first_delay_s
        self.max_delay_s = max_delay_s
        self.stable_after_s = stable_after_s
        self.log = log
        self._watched = [_Watched(p, delay_s=first_delay_s) for p in processes]

    def tick(self) -> bool:
        """Notice crashes and restart what is due; True when a process was started again."""
        restarted = False
        now = time.monotonic()
        for watched in self._watched:
            process = watched.process
            if not process.crashed:
                continue
            if watched.retry_at is None:
                self._schedule(watched, now)
            elif now >= watched.retry_at:
                restarted |= self._restart(watched, now)
        return restarted

    def status(self) -> dict[str, dict[str, Any]]:
        """Per process: its pid, whether it runs, and how many times it was restarted."""
        return {
            w.process.name: {"pid": w.process.pid, "running": w.process.running, "restarts": w.restarts}
            for w in self._watched
        }

    def _schedule(self, watched: _Watched, now: float) -> None:
        process = watched.process
        lived = now - watched.up_since
        if lived >= self.stable_after_s:
            watched.delay_s = self.first_delay_s
        watched.retry_at = now + watched.delay_s
        returncode = process.proc.returncode if process.proc is not None else None
        self.log(
            f"{process.name} (pid {process.pid}) exited after {lived:.1f} s "
            f"({exit_description(returncode)}); restarting in {watched.delay_s:g} s"
        )

    def _restart(self, watched: _Watched, now: float) -> bool:
        process = watched.process
        watched.retry_at = None
        watched.up_since = now
        watched.delay_s = min(watched.delay_s * 2, self.max_delay_s)
        try:
            process.start(wait_ready=False)
        except OSError as exc:  # the command itself cannot run: the next tick schedules another try
            self.log(f"{process.name} could not be started again: {exc}")
            return False
        watched.restarts += 1
        self.log(f"{process.name} restarted (pid {process.pid}, restart {watched.restarts})")
        return True
