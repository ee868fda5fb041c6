"""Quota counters in PostgreSQL, shared by the site services (authorization, processing, MCP).

- `BilledCounter`: exact. One atomic statement per request (an upsert that only increments below the
  limit, `RETURNING` the count); anything that keeps the count from being made is `QuotaUnavailable`,
  which callers answer by denying (fail closed).
- `BatchedCounter`: counted in process and flushed to PostgreSQL in batches (so worker processes and
  instances share one count); while PostgreSQL cannot be reached it serves a bounded overshoot for a
  bounded time, then raises `QuotaUnavailable`.
- `TokenCounter`: amounts (tokens) reserved atomically before the work, settled after it.

Windows are fixed and aligned on the epoch (`window_seconds` apart), so every instance counts into the
same window and a denial knows when its window resets (`Outcome.reset_s`, the `Retry-After`).
Both are synchronous (psycopg 3 with a connection pool): callers are thread-pool servers; no call
waits on an event loop.
"""

from stoa_quota.batched import BatchedCounter, DegradedMode
from stoa_quota.billed import BilledCounter
from stoa_quota.fields import rate_limit_fields
from stoa_quota.store import Outcome, QuotaStore, QuotaUnavailable, Window
from stoa_quota.tokens import Reservation, TokenCounter

__all__ = [
    "BatchedCounter",
    "BilledCounter",
    "DegradedMode",
    "Outcome",
    "QuotaStore",
    "QuotaUnavailable",
    "Reservation",
    "TokenCounter",
    "Window",
    "rate_limit_fields",
]
