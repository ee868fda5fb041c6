"""The counters' table and the connections to it (psycopg 3, a synchronous pool)."""

from __future__ import annotations

import contextlib
import importlib
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

SCHEMA = """
CREATE TABLE IF NOT EXISTS stoa_quota_counters (
    key       text    NOT NULL,
    window_s  integer NOT NULL,
    window_n  bigint  NOT NULL,
    used      bigint  NOT NULL,
    PRIMARY KEY (key, window_s, window_n)
)
"""


class QuotaUnavailable(Exception):
    """The count could not be made (PostgreSQL unreachable, too slow, or degraded for too long)."""


@dataclass(frozen=True, slots=True)
class Window:
    """One fixed window of `seconds`, the `number`-th since the epoch."""

    seconds: int
    number: int
    reset_s: float  # seconds until it ends

    @classmethod
    def at(cls, seconds: int, now: float) -> Window:
        number = math.floor(now / seconds)
        return cls(seconds, number, (number + 1) * seconds - now)


@dataclass(frozen=True, slots=True)
class Outcome:
    allowed: bool
    limit: int
    remaining: int
    window: Window

    @property
    def reset_s(self) -> int:
        """Whole seconds until the window resets (at least 1): the `Retry-After` of a denial."""
        return max(1, math.ceil(self.window.reset_s))


# How long a connection the pool could not make is retried before the pool gives it up (and makes
# one again at the next caller that finds none). The pool's own default, 5 minutes of doubling delays,
# left a store that was down for a minute refusing counts for about another minute once it was back.
RECONNECT_S = 1.0
# How long a caller waits for a connection while the server is known lost (see `execute`).
PROBE_S = 0.05


def _bounded_connection(connection: type, wait_timeout: type[Exception], wait_s: float) -> type:
    """A `connection` class whose every wait on the server gives up after `wait_s` (`wait_timeout`
    raised): a server that stops answering (a hung host, a stopped process, a dropped network) never
    enforces its own statement timeout, and the caller's thread would wait for TCP to give up, for
    many minutes."""

    class BoundedConnection(connection):  # type: ignore[misc, valid-type]
        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            try:
                return super().wait(gen, interval, wait_s if timeout is None else timeout)
            except wait_timeout:
                # Left mid-exchange with the server: never usable again (the pool discards it).
                self.close()
                raise

    return BoundedConnection


class QuotaStore:
    """A pool of connections to the counters' database; creates the table when absent.

    `timeout_s` bounds both waiting for a connection and each statement: a count that cannot be made
    in that time is `QuotaUnavailable`, never a stuck caller thread. A server that does not answer at
    all is given up after twice that (the server's own statement timeout comes first when it answers).
    """

    def __init__(
        self,
        dsn: str,
        *,
        max_size: int = 4,
        timeout_s: float = 0.5,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        self.timeout_s = timeout_s
        self._checking = threading.Lock()
        self._lost = False
        self._checker: threading.Thread | None = None
        statement_ms = max(1, int(timeout_s * 1000))
        # The driver is loaded by the first store: a service without a quota database never pays
        # for it at start-up (every worker process would).
        self._psycopg: Any = importlib.import_module("psycopg")
        psycopg_pool: Any = importlib.import_module("psycopg_pool")
        self._failures = (self._psycopg.Error, psycopg_pool.PoolTimeout, OSError)
        # What a wait on a server that does not answer raises (psycopg's own, private name).
        self._wait_timeout: type[Exception] = self._psycopg.errors._WaitTimeout
        self.pool = psycopg_pool.ConnectionPool(
            dsn,
            connection_class=_bounded_connection(self._psycopg.Connection, self._wait_timeout, 2 * timeout_s),
            reconnect_timeout=RECONNECT_S,
            reconnect_failed=self._unreachable,
            # Every connection opened at start (in the background): a caller's first burst never
            # waits for connections being made, which on a loaded machine can outlast `timeout_s`.
            min_size=max_size,
            max_size=max_size,
            timeout=timeout_s,
            kwargs={
                "autocommit": True,
                "connect_timeout": max(1, math.ceil(timeout_s)),
                "options": f"-c statement_timeout={statement_ms}",
            },
            open=False,
            name="stoa-quota",
        )

    def open(self, wait_s: float | None = 10.0) -> QuotaStore:
        """Open the pool; with `wait_s`, wait that long for a first connection and create the table."""
        if wait_s is None:
            self.pool.open(wait=False)
        else:
            self.pool.open(wait=True, timeout=wait_s)
            self.execute(lambda conn: conn.execute(SCHEMA))
        return self

    def close(self) -> None:
        self.pool.close()

    def execute(self, work: Callable[[psycopg.Connection], psycopg.Cursor]) -> list[tuple]:
        """Run one statement on a pooled connection; its rows. Any failure is QuotaUnavailable.
        A database without the table (first use, or down when the store opened) gets it here.

        Once a connection was found lost or could not be made, and until a statement succeeds again, a
        caller waits for a connection only `PROBE_S`: the pool has none to give, and waiting `timeout_s`
        each would hold every caller's thread that long (past the deadline of whoever waits on the
        caller). Each such wait still asks the pool for a connection, so one is made as soon as the
        server is back."""
        try:
            wait = min(PROBE_S, self.timeout_s) if self._lost else self.timeout_s
            with self.pool.connection(timeout=wait) as conn:
                try:
                    cursor = work(conn)
                except self._psycopg.errors.UndefinedTable:
                    conn.execute(SCHEMA)
                    cursor = work(conn)
                except self._psycopg.OperationalError as exc:
                    if isinstance(exc, self._wait_timeout):
                        # A server that stopped answering: known lost (testing the others would only
                        # wait on it too), so the next callers are not each held the whole timeout.
                        self._lost = True
                    elif conn.broken or conn.closed:
                        self._lost = True
                        self._check_idle()
                    raise
                rows = cursor.fetchall() if cursor.description is not None else []
            self._lost = False
            return rows
        except self._failures as exc:
            raise QuotaUnavailable(type(exc).__name__) from exc

    def _unreachable(self, _pool: object) -> None:
        """The pool could not connect for `RECONNECT_S` (the server down at start, or for long)."""
        self._lost = True

    def _check_idle(self) -> None:
        """A connection turned out lost (the server restarted, say): the idle ones most likely are too,
        and each would otherwise fail a count of its own before the pool replaced it. They are tested
        now, one check at a time, on a thread of its own: a lost connection fails its test at once, and
        the failing caller waits for that only briefly (one to a server that stopped answering would
        take a bounded wait)."""
        with self._checking:
            if self._checker is None or not self._checker.is_alive():
                self._checker = threading.Thread(
                    target=self._check_pool, name="stoa-quota-check", daemon=True
                )
                self._checker.start()
            checker = self._checker
        checker.join(min(PROBE_S, self.timeout_s))

    def _check_pool(self) -> None:
        with contextlib.suppress(Exception):  # a pool closed meanwhile: nothing left to check
            self.pool.check()
