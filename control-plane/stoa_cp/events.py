"""Fan-out of inventory changes to this process's SSE streams, fed by PostgreSQL LISTEN/NOTIFY.

One listening connection per process. A notification only wakes the streams of that gateway; each
stream then reads the current generation from the database itself, so a lost or coalesced
notification can delay an event but never skip one (after a reconnect every stream re-checks).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator

import asyncpg
from stoa_ops.backoff import Backoff

from stoa_cp.store import publication, tool_permissions

log = logging.getLogger("stoa_cp")
LISTENER_NAME = "stoa-cp-listen"


class InventoryEvents:
    def __init__(self, dsn: str, health_interval_s: float = 5.0) -> None:
        self._dsn = dsn
        self._health_interval_s = health_interval_s
        self._subscribers: dict[str, set[asyncio.Event]] = {}
        self._task: asyncio.Task[None] | None = None
        self.listening = asyncio.Event()
        # Set on every change of any gateway (then replaced): what the permissions keeper waits on.
        self._any_change = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._listen_forever(), name="stoa-cp-listen")
        # Start-up waits for the first LISTEN so that no change committed after start is missed.
        await asyncio.wait_for(self.listening.wait(), timeout=30)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    @contextlib.contextmanager
    def subscribe(self, gateway_id: str) -> Iterator[asyncio.Event]:
        wake = asyncio.Event()
        self._subscribers.setdefault(gateway_id, set()).add(wake)
        try:
            yield wake
        finally:
            subscribers = self._subscribers.get(gateway_id)
            if subscribers is not None:
                subscribers.discard(wake)
                if not subscribers:
                    del self._subscribers[gateway_id]

    def any_change(self) -> asyncio.Event:
        """An event set at the next change of any gateway."""
        return self._any_change

    def _changed(self) -> None:
        self._any_change.set()
        self._any_change = asyncio.Event()

    def _on_permissions(self, gateway_id: str) -> None:
        # A new signed artifact: the gateway's streams send it (no generation moved).
        self._wake(gateway_id)

    def _wake(self, gateway_id: str) -> None:
        for wake in self._subscribers.get(gateway_id, ()):
            wake.set()

    def _wake_all(self) -> None:
        for gateway_id in list(self._subscribers):
            self._wake(gateway_id)

    def _on_notify(self, gateway_id: str, generation: int) -> None:
        log.info("inventory_notified", extra={"fields": {"gateway": gateway_id, "generation": generation}})
        self._wake(gateway_id)
        self._changed()

    async def _listen_forever(self) -> None:
        backoff = Backoff(base_s=0.2, cap_s=5.0)
        while True:
            conn: asyncpg.Connection | None = None
            try:
                # Named, so an operator (or a test) can tell the listening connection in pg_stat_activity.
                conn = await publication.listen(
                    self._dsn,
                    LISTENER_NAME,
                    self._on_notify,
                    {tool_permissions.CHANNEL: self._on_permissions},
                )
                backoff.reset()
                self.listening.set()
                # Changes committed while we were not listening: let every stream re-check.
                self._wake_all()
                self._changed()
                while True:
                    await asyncio.sleep(self._health_interval_s)
                    await publication.still_listening(conn, self._health_interval_s)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self.listening.clear()
                delay = backoff.next_delay()
                log.warning(
                    "listen_connection_lost",
                    extra={"fields": {"error": repr(exc), "retry_in_s": round(delay, 3)}},
                )
                await asyncio.sleep(delay)
            finally:
                if conn is not None:
                    with contextlib.suppress(Exception):
                        await asyncio.wait_for(conn.close(), timeout=2)
