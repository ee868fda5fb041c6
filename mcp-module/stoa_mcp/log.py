"""The call log: one `tool_call` JSON line per tools/call answered (its outcome, the tenant, the tool and
how long the call took; never an argument, a result or the caller's identity), in the JSON log format
every service writes (`stoa_ops.logs`).

Call events do not go through `logging`: they are written in the same shape (ts, level, logger, event,
then the fields), buffered (`stoa_ops.logs.BufferedLines`), because a LogRecord, a handler lock and a
write syscall per call cost ~0.15 ms of CPU per call at one connection, against ~0.03 ms for a line buffered
(bench/PROFILE-mcp.md).
"""

from __future__ import annotations

import time

from stoa_ops import logs

CALL_LOGGER = "stoa_mcp.server"


class CallLog(logs.BufferedLines):
    def emit(self, outcome: str, tenant: str, tool: str | None = None, ms: float | None = None) -> None:
        """`outcome` is a closed set of snake_case names (no escaping); `tool` is left out for a call
        of a tool the caller may not see, so the log does not tell which names were tried."""
        fields = f'"outcome":"{outcome}","tenant":{logs.quoted(tenant)}'
        if tool is not None:
            fields += f',"tool":{logs.quoted(tool)}'
        if ms is not None:
            fields += f',"ms":{ms:.2f}'
        self.append(f"{logs.head(time.time(), 'info', CALL_LOGGER, 'tool_call')}{fields}}}\n")
