"""Phase 2, token budget: tokens reserved before a completion goes upstream, settled from its usage.

The reservation is the request's `max_tokens` (or `max_completion_tokens`, else the policy's default)
times the choices it asks for (`n`), taken atomically in the quota store (`stoa_quota.TokenCounter`,
PostgreSQL) only while it fits in the window's budget: a parallel burst can never commit more than
the budget. The response settles it from `usage.total_tokens` (a buffered JSON answer, or the final
chunk of a server-sent event stream with `stream_options.include_usage`); a missing, negative or
malformed usage, an answer that never completes, or a client that goes away mid-stream leaves the
reservation charged whole; a request the service never let through (its stream ended while the
store was reserving) gives it back.

Counts are per consumer (the id the authorization service set, `x-stoa-consumer-id`; a request
without one is refused) or per tenant, under the policy id, so every route of one policy shares them.
Billed budgets fail closed (no count, no access: 503); others pass uncounted while PostgreSQL cannot
be reached, for at most `STOA_PROC_BUDGET_DEGRADED_S` seconds, then are refused as well.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from stoa_proto import proc_pb2
from stoa_quota import QuotaUnavailable, Reservation, TokenCounter
from stoa_translate.policies import token_budget

from stoa_proc.reasons import Deny, Reason
from stoa_proc.rules import PolicyError, translated
from stoa_proc.stream import EVENT_END, event_data

log = logging.getLogger("stoa_proc.budget")

# A stream's usage chunk is small: a pending partial event larger than this is not one.
_MAX_PENDING = 64 * 1024


@dataclass(frozen=True)
class Budget(token_budget.TokenBudget):
    def key(self, tenant_id: str, consumer_id: str) -> str:
        owner = f"consumer/{consumer_id}" if self.per == "consumer" else "tenant"
        return f"token_budget/{tenant_id}/{self.policy_id}/{owner}"


def compile_budget(rule: proc_pb2.TokenBudgetRule) -> Budget:
    """The translator's own rule decides (one rule wherever a budget is read), and only its normal form
    is taken: a set the translator did not make is refused, never completed here."""
    if not rule.policy_id:
        raise PolicyError("needs a policy id")
    return Budget(**asdict(translated(token_budget.KIND, rule.budget, rule.policy_id)))


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def requested(document: Any, budget: Budget) -> int:
    """The tokens to reserve for this request body: its limit per choice times the choices it asks for
    (`n`, or `best_of` of a completion when more: each is generated, up to that many tokens); 400 for a
    limit, an `n` or a `best_of` that is not a positive integer."""
    if not isinstance(document, dict):
        raise Deny(Reason.MALFORMED_BODY)
    choices = 1
    for name in ("n", "best_of"):
        value = document.get(name)
        if value is not None:
            if not _positive_int(value):
                raise Deny(Reason.MALFORMED_BODY)
            choices = max(choices, int(value))
    for name in ("max_completion_tokens", "max_tokens"):
        if name in document and document[name] is not None:
            if not _positive_int(document[name]):
                raise Deny(Reason.MALFORMED_BODY)
            return int(document[name]) * choices
    return budget.default_max_tokens * choices


def usage_of(document: Any) -> int | None:
    """`usage.total_tokens` of a completion (or of a stream's chunk) when it is a whole number ≥ 0."""
    usage = document.get("usage") if isinstance(document, dict) else None
    total = usage.get("total_tokens") if isinstance(usage, dict) else None
    if isinstance(total, int) and not isinstance(total, bool) and total >= 0:
        return total
    return None


class StreamUsage:
    """Reads the usage a server-sent event stream reports (its last report wins), event by event."""

    def __init__(self) -> None:
        self._pending = b""
        self.total: int | None = None

    def feed(self, chunk: bytes) -> None:
        data = self._pending + chunk
        start = 0
        while (found := EVENT_END.search(data, start)) is not None:
            self._event(data[start : found.start()])
            start = found.end()
        self._pending = data[start:][-_MAX_PENDING:]

    def _event(self, event: bytes) -> None:
        if b"usage" not in event:
            return
        data = event_data(event)
        try:
            total = usage_of(json.loads(data)) if data is not None else None
        except (ValueError, RecursionError):
            return
        if total is not None:
            self.total = total


class Budgets:
    """The service's side of every budget: the counter (None without a quota database) and the
    degraded mode of non-billed budgets."""

    def __init__(
        self,
        counter: TokenCounter | None,
        degraded_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._counter = counter
        self._degraded_s = degraded_s
        self._clock = clock
        self._lock = threading.Lock()
        self._failing_since: float | None = None

    def reserve(self, budget: Budget, key: str, amount: int) -> Reservation | None:
        """The reservation, or None for a non-billed request passed uncounted while the store is
        unreachable; Deny 429 (Retry-After: the window's reset) or 503."""
        if self._counter is None:
            raise Deny(Reason.QUOTA_UNAVAILABLE)
        try:
            reservation = self._counter.reserve(key, amount, budget.tokens, budget.window_seconds)
        except QuotaUnavailable as exc:
            return self._unreachable(budget, exc)
        with self._lock:
            self._failing_since = None
        if not reservation.allowed:
            raise Deny(Reason.TOKEN_BUDGET_EXCEEDED, retry_after=reservation.outcome.reset_s)
        return reservation

    def _unreachable(self, budget: Budget, exc: QuotaUnavailable) -> None:
        now = self._clock()
        with self._lock:
            if self._failing_since is None:
                self._failing_since = now
                log.warning("quota_store_unreachable", extra={"fields": {"error": str(exc)}})
            degraded_for = now - self._failing_since
        if budget.billed or degraded_for > self._degraded_s:
            raise Deny(Reason.QUOTA_UNAVAILABLE) from exc
        return None

    def settle(self, reservation: Reservation, used: int) -> None:
        assert self._counter is not None  # a reservation exists only with a counter
        try:
            self._counter.settle(reservation, used)
        except QuotaUnavailable as exc:
            # The reservation stays charged whole: never less than what was reserved.
            log.warning("settlement_failed_reservation_stands", extra={"fields": {"error": str(exc)}})
