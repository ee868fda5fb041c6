"""The call log: one line per tools/call in the JSON log format every service writes, the names
quoted, nothing lost at close."""

from __future__ import annotations

import io
import json

from stoa_mcp.log import CALL_LOGGER, CallLog


def test_each_call_is_one_json_line_in_the_services_format_written_at_close() -> None:
    stream = io.StringIO()
    log = CallLog(stream)
    log.emit("ok", 'ten"ant', "get_order", 1.234)
    log.emit("unknown_tool", "acme")
    assert stream.getvalue() == ""  # buffered: nothing written per call
    log.close()
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [list(line)[:4] for line in lines] == [["ts", "level", "logger", "event"]] * 2
    assert lines[0] | {"ts": None} == {
        "ts": None,
        "level": "info",
        "logger": CALL_LOGGER,
        "event": "tool_call",
        "outcome": "ok",
        "tenant": 'ten"ant',
        "tool": "get_order",
        "ms": 1.23,
    }
    # A tool the caller may not see is not named.
    assert lines[1] | {"ts": None} == {
        "ts": None,
        "level": "info",
        "logger": CALL_LOGGER,
        "event": "tool_call",
        "outcome": "unknown_tool",
        "tenant": "acme",
    }
