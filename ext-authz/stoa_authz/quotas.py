"""Count a subscribed request against its plan: billed plans exactly (one atomic PostgreSQL statement
per request; no count, no access), the others through batched counters (`stoa_quota`).

The Check threads call PostgreSQL synchronously (psycopg 3, a pool as large as the Check thread pool):
no Check waits on an event loop (bench/PROFILE-quota.md has the measurement behind the choice).
"""

from __future__ import annotations

from stoa_quota import BatchedCounter, BilledCounter, Outcome, QuotaUnavailable, rate_limit_fields

from stoa_authz.policy import Subscription
from stoa_authz.reasons import Deny, Reason


class Quotas:
    def __init__(self, billed: BilledCounter | None = None, batched: BatchedCounter | None = None) -> None:
        # None: no quota database configured; every subscribed request is then quota_unavailable.
        self._billed = billed
        self._batched = batched

    def take(self, tenant: str, subscription: Subscription) -> list[tuple[str, str]]:
        """Count one request; the RateLimit fields for the client, or Deny (429 quota_exceeded with
        Retry-After from the window's reset, 503 quota_unavailable)."""
        counter = self._billed if subscription.billed else self._batched
        if counter is None:
            raise Deny(Reason.QUOTA_UNAVAILABLE)
        try:
            outcome: Outcome = counter.take(
                f"{tenant}/{subscription.subscription_id}", subscription.requests, subscription.window_seconds
            )
        except QuotaUnavailable as exc:
            raise Deny(Reason.QUOTA_UNAVAILABLE) from exc
        fields = rate_limit_fields(subscription.plan_id, outcome)
        if not outcome.allowed:
            raise Deny(Reason.QUOTA_EXCEEDED, [("retry-after", str(outcome.reset_s)), *fields])
        return fields
