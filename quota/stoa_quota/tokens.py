"""Token budgets: amounts reserved before the work and settled after it, in the counters' table.

`reserve` adds an amount to the window's count in one statement, only while the count stays within
the limit (the upsert's row lock serialises concurrent reservations, so together they never commit
more than the limit); `settle` then corrects the count by what was used minus what was reserved, in
the window the reservation was made in. A reservation never settled stays charged whole.
"""

from __future__ import annotations

from dataclasses import dataclass

from stoa_quota.store import Outcome, QuotaStore, Window

# The first reservation of a window inserts the row (only when the amount fits at all); later ones
# add to it only while the sum stays within the limit.
_RESERVE = (
    "INSERT INTO stoa_quota_counters AS c (key, window_s, window_n, used)"
    " SELECT %(key)s, %(window_s)s, %(window_n)s, %(amount)s WHERE %(amount)s <= %(limit)s"
    " ON CONFLICT (key, window_s, window_n) DO UPDATE SET used = c.used + EXCLUDED.used"
    " WHERE c.used + EXCLUDED.used <= %(limit)s"
    " RETURNING used"
)
_SETTLE = (
    "UPDATE stoa_quota_counters SET used = used + %(delta)s"
    " WHERE key = %(key)s AND window_s = %(window_s)s AND window_n = %(window_n)s"
)
_USED = (
    "SELECT used FROM stoa_quota_counters"
    " WHERE key = %(key)s AND window_s = %(window_s)s AND window_n = %(window_n)s"
)


@dataclass(frozen=True, slots=True)
class Reservation:
    key: str
    amount: int
    outcome: Outcome

    @property
    def allowed(self) -> bool:
        return self.outcome.allowed


class TokenCounter:
    def __init__(self, store: QuotaStore) -> None:
        self._store = store

    def reserve(self, key: str, amount: int, limit: int, window_seconds: int) -> Reservation:
        """Reserve `amount` of `limit` per window; not allowed when it does not fit. QuotaUnavailable
        when the count cannot be made."""
        window = Window.at(window_seconds, self._store.clock())
        params = {
            "key": key,
            "window_s": window_seconds,
            "window_n": window.number,
            "amount": amount,
            "limit": limit,
        }
        rows = self._store.execute(lambda conn: conn.execute(_RESERVE, params, prepare=True))
        if not rows:
            return Reservation(key, amount, Outcome(False, limit, 0, window))
        return Reservation(key, amount, Outcome(True, limit, max(0, limit - int(rows[0][0])), window))

    def settle(self, reservation: Reservation, used: int) -> None:
        """Charge `used` instead of the reserved amount (nothing to write when they are equal)."""
        delta = used - reservation.amount
        if not reservation.allowed or delta == 0:
            return
        window = reservation.outcome.window
        params = {
            "key": reservation.key,
            "window_s": window.seconds,
            "window_n": window.number,
            "delta": delta,
        }
        self._store.execute(lambda conn: conn.execute(_SETTLE, params, prepare=True))

    def used(self, key: str, window_seconds: int) -> int:
        """The current window's count (0 when nothing was reserved in it)."""
        window = Window.at(window_seconds, self._store.clock())
        params = {"key": key, "window_s": window_seconds, "window_n": window.number}
        rows = self._store.execute(lambda conn: conn.execute(_USED, params))
        return int(rows[0][0]) if rows else 0
