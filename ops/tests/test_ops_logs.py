"""The JSON log format: the same head on every line, fields after it, one object per line."""

from __future__ import annotations

import io
import json
import logging
import re
import time

import pytest
from stoa_ops import logs

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


@pytest.fixture
def captured() -> io.StringIO:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonLines())
    logger = logging.getLogger("stoa_test.logs")
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield stream
    logger.removeHandler(handler)


def test_a_record_is_one_line_with_the_common_head_then_its_fields(captured: io.StringIO) -> None:
    log = logging.getLogger("stoa_test.logs")
    log.info("ads_connected", extra={"fields": {"identity": "spiffe://x", "stream": 3}})
    log.warning("started", extra={"grpc_address": "127.0.0.1:1"})
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("apply_crashed", extra={"fields": {"generation": 4}})

    lines = captured.getvalue().splitlines()
    events = [json.loads(line) for line in lines]
    assert [list(e)[:4] for e in events] == [["ts", "level", "logger", "event"]] * 3
    assert events[0] | {"ts": ""} == {
        "ts": "",
        "level": "info",
        "logger": "stoa_test.logs",
        "event": "ads_connected",
        "identity": "spiffe://x",
        "stream": 3,
    }
    assert events[1]["grpc_address"] == "127.0.0.1:1"
    assert events[1]["level"] == "warning"
    assert events[2]["generation"] == 4
    assert "RuntimeError: boom" in events[2]["exception"]
    assert all(ISO_MS.match(e["ts"]) for e in events)


def test_timestamp_is_utc_with_milliseconds() -> None:
    assert logs.timestamp(0.0) == "1970-01-01T00:00:00.000Z"
    assert logs.timestamp(1_764_554_636.25) == "2025-12-01T02:03:56.250Z"
    assert logs.timestamp(1_764_554_636.999) == "2025-12-01T02:03:56.999Z"
    assert logs.timestamp(1_764_554_637.0) == "2025-12-01T02:03:57.000Z"


def test_head_is_what_the_formatter_writes_for_a_record_without_fields() -> None:
    now = time.time()
    record = logging.LogRecord("stoa_authz.decision", logging.INFO, "", 0, "ext_authz_decision", None, None)
    record.created = now
    written = json.loads(logs.head(now, "info", "stoa_authz.decision", "ext_authz_decision") + '"x":1}')
    assert written == json.loads(logs.JsonLines().format(record)) | {"x": 1}


class FailingOnce(io.StringIO):
    """A stream whose first write fails (a full disk, a closed pipe), then recovers."""

    def __init__(self) -> None:
        super().__init__()
        self.failed = False

    def write(self, text: str) -> int:
        if not self.failed:
            self.failed = True
            raise OSError("no space left on device")
        return super().write(text)


def test_buffered_lines_survive_a_failed_write_in_order() -> None:
    stream = FailingOnce()
    lines = logs.BufferedLines(stream)
    lines.append("one\n")
    lines.append("two\n")
    with pytest.raises(OSError, match="no space"):
        lines.flush()
    lines.append("three\n")
    lines.close()
    assert stream.getvalue() == "one\ntwo\nthree\n"
