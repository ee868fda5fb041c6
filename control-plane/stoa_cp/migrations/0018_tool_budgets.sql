-- MCP budgets: calls per window per consumer of a tool, counted by the MCP module in the quota store.
ALTER TABLE tools ADD COLUMN budget_calls integer CHECK (budget_calls > 0);
ALTER TABLE tools ADD COLUMN budget_window_s integer CHECK (budget_window_s > 0);
ALTER TABLE tools ADD CONSTRAINT tools_budget_whole CHECK ((budget_calls IS NULL) = (budget_window_s IS NULL));
