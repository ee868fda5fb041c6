"""MCP budgets: calls per window per consumer and tool, counted in the shared PostgreSQL quota store
with one atomic statement per call, failing closed."""

from __future__ import annotations

from typing import Protocol

from stoa_mcp.permissions import Caller


class BudgetUnavailable(Exception):
    """The store cannot count now: the call is refused (fail closed)."""


class Budgets(Protocol):
    async def spend(self, caller: Caller, tool: str) -> int | None:
        """Count one call; None when within the budget, else the seconds until the window resets.
        Raises BudgetUnavailable when it cannot count."""
        ...
