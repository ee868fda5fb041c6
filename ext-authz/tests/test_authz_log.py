"""The buffered decision log: every event is written, as one JSON line, whatever stops the process."""

from __future__ import annotations

import io
import json
import re
import threading

from stoa_authz.log import DecisionLog
from stoa_harness.wait import wait_until
from stoa_ops.logs import DecisionPlace


def emit(log: DecisionLog, request_id: str = "r-1") -> None:
    log.emit(
        "deny",
        "missing_token",
        DecisionPlace(
            tenant="acme", api="orders", route="orders", request_id=request_id, policy_set_version="v1"
        ),
        0.1234,
    )


def lines(stream: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


def test_line_has_the_json_lines_shape_and_escapes_request_values() -> None:
    stream = io.StringIO()
    log = DecisionLog(stream)
    emit(log, request_id='quote" back\\ newline\n unicode é')
    log.flush()
    [event] = lines(stream)
    assert event["request_id"] == 'quote" back\\ newline\n unicode é'
    assert {k: event[k] for k in ("level", "logger", "event", "decision", "reason", "latency_ms")} == {
        "level": "info",
        "logger": "stoa_authz.decision",
        "event": "ext_authz_decision",
        "decision": "deny",
        "reason": "missing_token",
        "latency_ms": 0.123,
    }
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", event["ts"])
    assert list(event)[:4] == ["ts", "level", "logger", "event"], "the head every service's lines share"


def test_flusher_writes_on_its_interval_and_close_writes_the_rest() -> None:
    stream = io.StringIO()
    log = DecisionLog(stream, interval_s=0.01).start()
    emit(log, "a")
    wait_until(lambda: len(lines(stream)) == 1, 5, "the flusher to write the first event")
    log.close()  # stop the flusher first, so the next event can only be written by close()
    emit(log, "b")
    assert len(lines(stream)) == 1
    log.close()
    assert [e["request_id"] for e in lines(stream)] == ["a", "b"]


def test_full_buffer_is_written_by_the_emitting_thread() -> None:
    stream = io.StringIO()
    log = DecisionLog(stream, max_lines=3)  # no flusher
    for n in range(3):
        emit(log, str(n))
    assert [e["request_id"] for e in lines(stream)] == ["0", "1", "2"]


def test_concurrent_emitters_lose_nothing() -> None:
    stream = io.StringIO()
    log = DecisionLog(stream, interval_s=0.001, max_lines=50).start()

    def burst(tag: int) -> None:
        for n in range(2000):
            emit(log, f"{tag}-{n}")

    threads = [threading.Thread(target=burst, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    log.close()
    ids = [e["request_id"] for e in lines(stream)]
    assert len(ids) == len(set(ids)) == 8000
