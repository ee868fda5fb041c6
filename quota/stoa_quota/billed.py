"""Billed quotas: exact, one atomic statement per request, fail closed."""

from __future__ import annotations

from stoa_quota.store import Outcome, QuotaStore, Window

# Inserts the window's first count, or increments it only while it is below the limit; the row lock
# of the upsert serialises concurrent requests, so no two can take the last unit.
_TAKE = (
    "INSERT INTO stoa_quota_counters AS c (key, window_s, window_n, used) VALUES (%s, %s, %s, 1)"
    " ON CONFLICT (key, window_s, window_n) DO UPDATE SET used = c.used + 1 WHERE c.used < %s"
    " RETURNING used"
)


class BilledCounter:
    def __init__(self, store: QuotaStore) -> None:
        self._store = store

    def take(self, key: str, limit: int, window_seconds: int) -> Outcome:
        """Count one request against `limit` per window; QuotaUnavailable when it cannot be counted."""
        window = Window.at(window_seconds, self._store.clock())
        rows = self._store.execute(
            lambda conn: conn.execute(_TAKE, (key, window_seconds, window.number, limit), prepare=True)
        )
        if not rows:
            return Outcome(False, limit, 0, window)
        return Outcome(True, limit, max(0, limit - int(rows[0][0])), window)
