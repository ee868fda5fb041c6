"""The JSON-lines log format of every STOA service: one JSON object per line on stderr.

Every line starts with the same four fields, in this order:

- `ts`: the time, ISO 8601 in UTC with milliseconds (`2026-12-01T02:03:04.567Z`);
- `level`: `debug`, `info`, `warning`, `error` or `critical`;
- `logger`: the logger name (`stoa_link.ads`, `stoa_authz.decision`, `stoa_cp`, ...);
- `event`: what happened, a snake_case name (`ads_connected`, `ext_authz_decision`, ...);

then the event's own fields (passed as `extra={"fields": {...}}`), and `exception` (the formatted
traceback) when one is being logged. A service that writes lines without `logging` (the decision
log, for its cost) writes the same head with `head()`.
"""

from __future__ import annotations

import collections
import json
import logging
import sys
import threading
import time
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii  # type: ignore[attr-defined]
from typing import NamedTuple, Self, TextIO

# JSON's quoting of a string, at C speed (what a line written without `logging` quotes its names with).
quoted = encode_basestring_ascii
# Attributes every LogRecord has; anything else on a record came from `extra` and is a field.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {"message", "fields", "asctime"}

_second: tuple[int, str] = (-1, "")


def timestamp(created: float) -> str:
    """`created` (seconds since the epoch) as the `ts` field; the text of each second is kept, so a
    busy writer formats a date once per second, not once per line."""
    global _second
    whole = int(created)
    cached_at, prefix = _second
    if cached_at != whole:
        prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(whole))
        _second = (whole, prefix)
    return f"{prefix}.{int((created - whole) * 1000):03d}Z"


def head(created: float, level: str, logger: str, event: str) -> str:
    """The start of a line, up to and including the comma after `event`, for writers that append
    their fields themselves; `logger` and `event` must need no JSON escaping."""
    return f'{{"ts":"{timestamp(created)}","level":"{level}","logger":"{logger}","event":"{event}",'


class DecisionPlace(NamedTuple):
    """Where a decision log's decision was taken (route data only, never a token or a claim): the
    fields every decision event carries, in ext-authz's and ext-proc's logs alike."""

    tenant: str
    api: str
    route: str
    request_id: str
    policy_set_version: str

    def tail(self, latency_ms: float) -> str:
        """The end of a decision line written without `logging`: these fields and the latency, then
        the closing brace and the line break."""
        return (
            f'"tenant":{quoted(self.tenant)},"api":{quoted(self.api)},"route":{quoted(self.route)},'
            f'"request_id":{quoted(self.request_id)},"latency_ms":{latency_ms:.3f},'
            f'"policy_set_version":{quoted(self.policy_set_version)}}}\n'
        )


class BufferedLines:
    """Lines written in batches, for a writer that emits one per request (a decision log), where a
    LogRecord, a handler lock and a write syscall each time cost about as much as the request's work.

    `append` only adds the line to a deque (thread-safe, no lock, no syscall); a flusher thread writes
    what accumulated every `interval_s`, and `close()` stops it and writes the rest, so nothing is lost
    at shutdown. When `max_lines` are waiting, the caller that adds one more writes them itself:
    back-pressure, never a dropped line. Lines go to `stream`, else to stderr at the time of writing.
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

    def append(self, line: str) -> None:
        self._lines.append(line)
        if len(self._lines) >= self._max_lines:
            self.flush()

    def flush(self) -> None:
        with self._write:
            count = len(self._lines)
            if not count:
                return
            lines = [self._lines.popleft() for _ in range(count)]
            stream = self._stream or sys.stderr
            try:
                stream.write("".join(lines))
                stream.flush()
            except BaseException:
                # Back at the head of the queue, in order: the next flush (or close) writes them.
                self._lines.extendleft(reversed(lines))
                raise

    def start(self) -> Self:
        if self._flusher is None:
            self._flusher = threading.Thread(target=self._run, name="buffered-lines", daemon=True)
            self._flusher.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self.flush()
            except Exception:  # a failing stream must not stop the flusher; close() retries
                logging.getLogger(__name__).exception("buffered log write failed")

    def close(self) -> None:
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
            self._flusher = None
        self.flush()


class JsonLines(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": timestamp(record.created),
            "level": record.levelname.lower(),
            "logger": record.name,
            "event": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update(fields)
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD})
        if record.exc_info and record.exc_info[0] is not None:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, separators=(",", ":"))


def configure(level: int | str = logging.INFO, quiet: Iterable[str] = ()) -> None:
    """Send every log record to stderr as JSON lines; `quiet` loggers only from WARNING up."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper() if isinstance(level, str) else level)
    for name in quiet:
        logging.getLogger(name).setLevel(logging.WARNING)
