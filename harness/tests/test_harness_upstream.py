"""The echo upstream measures nothing of its own: keep-alive requests are answered without a
delayed-ACK stall, and its record of arrivals stays bounded however long it runs."""

from __future__ import annotations

import http.client
import statistics
import time

from stoa_harness.upstream import EchoUpstream

# With Nagle on, each response's second write waits for the client's delayed ACK: at least 40 ms on
# Linux, every request after the connection's first few. Answered at once it takes well under 1 ms;
# the bound leaves room for a loaded machine and still cannot be met by a stalled answer.
STALL_FREE_MEDIAN_S = 0.015


def test_keep_alive_requests_are_answered_without_a_delayed_ack_stall() -> None:
    with EchoUpstream() as up:
        conn = http.client.HTTPConnection("127.0.0.1", up.port, timeout=5)
        try:
            took = []
            for i in range(20):
                started = time.perf_counter()
                conn.request(
                    "POST", f"/k/{i}", body=b'{"n": 1}', headers={"content-type": "application/json"}
                )
                response = conn.getresponse()
                assert response.status == 200
                assert response.read()
                took.append(time.perf_counter() - started)
        finally:
            conn.close()
        assert len({a.path for a in up.arrivals()}) == 20  # one connection, every request answered
    assert statistics.median(took) < STALL_FREE_MEDIAN_S, [round(t * 1000, 2) for t in took]


def test_the_record_keeps_only_the_latest_arrivals() -> None:
    with EchoUpstream(max_arrivals=5) as up:
        conn = http.client.HTTPConnection("127.0.0.1", up.port, timeout=5)
        try:
            for i in range(12):
                conn.request("GET", f"/r/{i}")
                assert conn.getresponse().read()
        finally:
            conn.close()
        assert [a.path for a in up.arrivals()] == [f"/r/{i}" for i in range(7, 12)]
        assert up.wait_arrivals(5, path_prefix="/r/")[-1].path == "/r/11"
