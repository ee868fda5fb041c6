"""The decision log: one `ext_authz_decision` JSON line per decision, in the JSON log format every
service writes (`stoa_ops.logs`).

Decision events do not go through `logging`: `DecisionLog` writes them in the same shape (ts, level,
logger, event, then the decision's fields), buffered, because a LogRecord, a handler lock and a
write syscall per Check cost about as much as the decision itself. Nothing here ever receives a token
or a claim value (the decision module passes only route data, reasons and timings).
"""

from __future__ import annotations

import time

from stoa_ops import logs

DECISION_LOGGER = "stoa_authz.decision"


class DecisionLog(logs.BufferedLines):
    """One `ext_authz_decision` JSON line per decision, buffered (`stoa_ops.logs.BufferedLines`)."""

    def emit(self, decision: str, reason: str, place: logs.DecisionPlace, latency_ms: float) -> None:
        self.append(
            f"{logs.head(time.time(), 'info', DECISION_LOGGER, 'ext_authz_decision')}"
            f'"decision":"{decision}","reason":"{reason}",{place.tail(latency_ms)}'
        )
