"""MCP budgets: calls per window per consumer and tool, counted in the quota store the authorization
service counts billed quotas in (`stoa_quota`: one atomic PostgreSQL statement per call), failing
closed: a call that cannot be counted is refused."""

from __future__ import annotations

import asyncio
from typing import Any

from stoa_mcp.permissions import Caller


class BudgetUnavailable(Exception):
    """The store cannot count now: the call is refused (fail closed)."""


def budget_key(caller: Caller, tool: str) -> str:
    return f"mcp:{caller.tenant_id}:{tool}:{caller.consumer}"


class Budgets:
    """Counts through `stoa_quota.BilledCounter` on the store at `dsn`, opened at the first call of a
    tool with a budget (a module whose tools have none never loads the driver); without a store every
    tool with a budget is refused: it cannot be counted."""

    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._store: Any = None
        self._counter: Any = None
        self._unavailable: tuple[type[Exception], ...] = (BudgetUnavailable,)

    def _open(self) -> Any:
        if self._counter is None:
            if not self._dsn:
                raise BudgetUnavailable("no quota store (STOA_MCP_DATABASE_URL)")
            import stoa_quota

            self._store = stoa_quota.QuotaStore(self._dsn).open(wait_s=None)
            self._counter = stoa_quota.BilledCounter(self._store)
            self._unavailable = (stoa_quota.QuotaUnavailable,)
        return self._counter

    async def spend(self, caller: Caller, tool: str, calls: int, window_s: int) -> int | None:
        """Count one call; None within the budget, else the seconds until the window resets.
        BudgetUnavailable when it cannot be counted."""
        counter = self._open()
        try:
            # The store's client is synchronous: off the event loop.
            outcome = await asyncio.to_thread(counter.take, budget_key(caller, tool), calls, window_s)
        except self._unavailable as exc:
            raise BudgetUnavailable(str(exc)) from exc
        return None if outcome.allowed else outcome.reset_s

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
