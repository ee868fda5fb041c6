"""The decision log: one `ext_authz_decision` JSON line per decision, in the JSON log format every
service writes (`stoa_ops.logs`).

Decision events do not go through `logging`: `DecisionLog` writes them in the same shape (ts, level,
logger, event, then the decision's fields), buffered, because a LogRecord, a handler lock and a
write syscall per Check cost about as much as the decision itself. Nothing here ever receives a token
or a claim value (the decision module passes only route data, reasons and timings).
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import TextIO

from stoa_ops import logs

DECISION_LOGGER = "stoa_authz.decision"


class DecisionLog:
    """One `ext_authz_decision` JSON line per decision, buffered.

    A Check only formats its line and appends it to a deque (thread-safe, no lock, no syscall); a
    flusher thread writes what accumulated every `interval_s`, and `close()` stops it and writes the
    rest, so nothing is lost at shutdown. When `max_lines` are waiting, the Check that adds one more
    writes them itself: back-pressure, never a dropped event.
    """

    def __init__(
        self, stream: TextIO | None = None, *, interval_s: float = 0.05, max_lines: int = 4096
    ) -> None:
        self._stream = stream
        self._interval_s = interval_s
        self._max_lines = max_lines
        self._lines: collections.deque[str] = collections.deque()
        self._write = threading.Lock()
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None

    def emit(self, decision: str, reason: str, place: logs.DecisionPlace, latency_ms: float) -> None:
        line = (
            f"{logs.head(time.time(), 'info', DECISION_LOGGER, 'ext_authz_decision')}"
            f'"decision":"{decision}","reason":"{reason}",'
            f'"tenant":{encode_basestring_ascii(place.tenant)},"api":{encode_basestring_ascii(place.api)},'
            f'"route":{encode_basestring_ascii(place.route)},'
            f'"request_id":{encode_basestring_ascii(place.request_id)},'
            f'"latency_ms":{latency_ms:.3f},'
            f'"policy_set_version":{encode_basestring_ascii(place.policy_set_version)}}}\n'
        )
        self._lines.append(line)
        if len(self._lines) >= self._max_lines:
            self.flush()

    def flush(self) -> None:
        with self._write:
            count = len(self._lines)
            if not count:
                return
            chunk = "".join(self._lines.popleft() for _ in range(count))
            stream = self._stream or sys.stderr
            stream.write(chunk)
            stream.flush()

    def start(self) -> DecisionLog:
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._run, name="decision-log", daemon=True)
            self._flusher.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.flush()
            except Exception:  # a failing stream must not stop the flusher; close() retries
                logging.getLogger(DECISION_LOGGER).exception("decision log write failed")

    def close(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        self.flush()
