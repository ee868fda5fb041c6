"""Non-billed quotas: counted in process, flushed to PostgreSQL in batches.

A request is decided from what this process knows: the window's shared count as of the last flush
(every process's and instance's flushed requests) plus its own not yet flushed; a counter a process
has not flushed yet starts from its own count. Between flushes the instances may together admit a
little more than the limit (their rates times the flush interval): the price of not writing per request.

Degraded mode: when a flush fails, each counter admits at most `DegradedMode.overshoot` more requests
(and never beyond its limit as this process sees it) for at most `DegradedMode.max_s` seconds; after
that, or once a counter's overshoot is spent, `take` raises `QuotaUnavailable` until a flush succeeds.
Counts made while degraded are flushed when PostgreSQL is back.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from stoa_quota.store import Outcome, QuotaStore, QuotaUnavailable, Window

log = logging.getLogger("stoa_quota.batched")

# Adds each counter's unflushed requests (0 reads the shared count) and returns the totals.
_FLUSH = (
    "INSERT INTO stoa_quota_counters AS c (key, window_s, window_n, used)"
    " SELECT * FROM unnest(%s::text[], %s::integer[], %s::bigint[], %s::bigint[])"
    " ON CONFLICT (key, window_s, window_n) DO UPDATE SET used = c.used + EXCLUDED.used"
    " RETURNING key, window_s, window_n, used"
)


@dataclass(frozen=True, slots=True)
class DegradedMode:
    # Requests a counter may still admit while PostgreSQL is unreachable.
    overshoot: int = 10
    # Seconds of unreachability after which every request is refused.
    max_s: float = 5.0


@dataclass(slots=True)
class _Count:
    shared: int = 0  # the window's count in PostgreSQL at the last flush (ours included)
    pending: int = 0  # admitted here, not yet sent
    inflight: int = 0  # sent by the flush under way
    degraded: int = 0  # admitted since the flushes started failing


class BatchedCounter:
    def __init__(
        self, store: QuotaStore, flush_interval_s: float = 0.1, degraded: DegradedMode | None = None
    ) -> None:
        self._store = store
        self._interval = flush_interval_s
        self._degraded = degraded or DegradedMode()
        self._lock = threading.Lock()
        self._counts: dict[tuple[str, int, int], _Count] = {}
        self._failing_since: float | None = None
        self._expiry_told = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stoa-quota-flush", daemon=True)

    def start(self) -> BatchedCounter:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        self.flush()

    def take(self, key: str, limit: int, window_seconds: int) -> Outcome:
        now = self._store.clock()
        window = Window.at(window_seconds, now)
        with self._lock:
            count = self._counts.setdefault((key, window_seconds, window.number), _Count())
            used = count.shared + count.pending + count.inflight
            if self._failing_since is not None:
                if now - self._failing_since > self._degraded.max_s:
                    raise QuotaUnavailable("degraded for longer than allowed")
                if used < limit and count.degraded >= self._degraded.overshoot:
                    raise QuotaUnavailable("degraded overshoot spent")
            if used >= limit:
                return Outcome(False, limit, 0, window)
            count.pending += 1
            if self._failing_since is not None:
                count.degraded += 1
            return Outcome(True, limit, limit - used - 1, window)

    def flush(self) -> None:
        """Send what was admitted since the last flush and learn the shared counts."""
        now = self._store.clock()
        with self._lock:
            # Windows that have ended are dropped once flushed: nothing will count into them again.
            for slot in [s for s, c in self._counts.items() if _ended(s, now) and not c.pending]:
                del self._counts[slot]
            batch = list(self._counts.items())
            for _, count in batch:
                count.inflight, count.pending = count.pending, 0
        if not batch:
            return
        keys, seconds, numbers, deltas = zip(
            *((slot[0], slot[1], slot[2], count.inflight) for slot, count in batch), strict=True
        )
        try:
            rows = self._store.execute(
                lambda conn: conn.execute(_FLUSH, (list(keys), list(seconds), list(numbers), list(deltas)))
            )
        except QuotaUnavailable as exc:
            with self._lock:
                for _, count in batch:
                    count.pending += count.inflight
                    count.inflight = 0
                if self._failing_since is None:
                    self._failing_since = now
                    self._expiry_told = False
                    log.warning("quota flush failed: degraded mode", extra={"error": str(exc)})
                elif not self._expiry_told and now - self._failing_since > self._degraded.max_s:
                    # Said once, by the flusher: from here on `take` refuses every request.
                    self._expiry_told = True
                    log.warning("quota degraded mode expired: denying", extra={"error": str(exc)})
            return
        with self._lock:
            totals = {(row[0], row[1], row[2]): int(row[3]) for row in rows}
            for slot, count in batch:
                count.shared = totals.get(slot, count.shared + count.inflight)
                count.inflight = 0
                count.degraded = 0
            if self._failing_since is not None:
                log.info("quota flush succeeded: degraded mode over")
            self._failing_since = None

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.flush()
            except Exception:
                log.exception("quota flush failed unexpectedly")


def _ended(slot: tuple[str, int, int], now: float) -> bool:
    _, seconds, number = slot
    return (number + 1) * seconds <= now
