"""The Check witness and the echo upstream, on their own (the acceptance tests drive them through a
real Envoy; here, that each scripted rule answers as documented and everything is recorded)."""

from __future__ import annotations

import time

import grpc
import httpx
import pytest
from envoy.service.auth.v3 import external_auth_pb2, external_auth_pb2_grpc
from google.rpc import code_pb2
from stoa_harness.upstream import EchoUpstream
from stoa_harness.witness import Allow, CheckWitness, Deny
from stoa_proto.bodies import DENY_BODIES


@pytest.fixture(scope="module")
def witness():
    with CheckWitness() as running:
        yield running


@pytest.fixture
def stub(witness: CheckWitness):
    witness.clear()
    with grpc.insecure_channel(witness.address) as channel:
        yield external_auth_pb2_grpc.AuthorizationStub(channel)
    witness.clear()


def _request(method: str = "GET", path: str = "/apis/a/x") -> external_auth_pb2.CheckRequest:
    req = external_auth_pb2.CheckRequest()
    req.attributes.request.http.method = method
    req.attributes.request.http.path = path
    req.attributes.request.http.headers["x-probe"] = "1"
    req.attributes.context_extensions["api_id"] = "a"
    return req


def test_allow_records_the_check_and_adds_headers(witness: CheckWitness, stub) -> None:
    witness.allow({"x-stoa-tenant-id": "t1"})
    response = stub.Check(_request(), timeout=5, wait_for_ready=True)
    assert response.status.code == code_pb2.OK
    added = [(h.header.key, h.header.value) for h in response.ok_response.headers]
    assert added == [("x-stoa-tenant-id", "t1")]
    [check] = witness.checks()
    assert (check.method, check.path, check.header("X-Probe")) == ("GET", "/apis/a/x", "1")
    assert check.context_extensions == {"api_id": "a"}


def test_deny_answers_403_with_the_neutral_body(witness: CheckWitness, stub) -> None:
    witness.deny()
    response = stub.Check(_request(), timeout=5, wait_for_ready=True)
    assert response.status.code == code_pb2.PERMISSION_DENIED
    assert response.denied_response.status.code == 403
    assert response.denied_response.body.encode() == DENY_BODIES[403]


def test_a_rule_can_decide_per_check(witness: CheckWitness, stub) -> None:
    witness.set_rule(lambda check: Deny(401) if check.method == "POST" else Allow())
    assert stub.Check(_request("GET"), timeout=5, wait_for_ready=True).status.code == code_pb2.OK
    denied = stub.Check(_request("POST"), timeout=5, wait_for_ready=True)
    assert denied.denied_response.status.code == 401
    assert [c.method for c in witness.checks()] == ["GET", "POST"]


def test_hang_holds_the_answer_until_released(witness: CheckWitness, stub) -> None:
    witness.hang()
    held = stub.Check.future(_request(), timeout=10, wait_for_ready=True)
    witness.wait_checks(1)
    assert not held.done()
    witness.release(Deny())
    assert held.result(timeout=5).denied_response.status.code == 403


def test_crash_refuses_connections_until_started_again(witness: CheckWitness, stub) -> None:
    witness.crash()
    with pytest.raises(grpc.RpcError) as refused:
        stub.Check(_request(), timeout=2)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    witness.start()
    assert stub.Check(_request(), timeout=10, wait_for_ready=True).status.code == code_pb2.OK


def test_fail_answers_with_the_grpc_status(witness: CheckWitness, stub) -> None:
    witness.fail(grpc.StatusCode.INTERNAL)
    with pytest.raises(grpc.RpcError) as failed:
        stub.Check(_request(), timeout=5, wait_for_ready=True)
    assert failed.value.code() == grpc.StatusCode.INTERNAL
    assert len(witness.checks()) == 1


def test_slow_answers_the_rule_only_after_the_delay(witness: CheckWitness, stub) -> None:
    witness.slow(0.4, Deny())
    started = time.monotonic()
    answer = stub.Check(_request(), timeout=5, wait_for_ready=True)
    assert time.monotonic() - started >= 0.4
    assert answer.denied_response.status.code == 403


def test_upstream_echoes_and_records_arrivals() -> None:
    with EchoUpstream() as up:
        response = httpx.post(f"{up.url}/a%2Fb?q=1", content=b"hi", headers={"X-Probe": "1"})
        assert response.json()["path"] == "/a%2Fb"
        [arrival] = up.arrivals()
        assert (arrival.method, arrival.path, arrival.query, arrival.body) == ("POST", "/a%2Fb", "q=1", b"hi")
        assert arrival.header("x-probe") == "1"
        up.reply_with(503)
        assert httpx.get(up.url).status_code == 503
        up.clear()
        assert up.arrivals() == []
        assert httpx.get(up.url).status_code == 200


def test_the_witness_keeps_only_the_latest_checks() -> None:
    with CheckWitness(max_checks=3) as small, grpc.insecure_channel(small.address) as channel:
        bounded = external_auth_pb2_grpc.AuthorizationStub(channel)
        for i in range(7):
            bounded.Check(_request(path=f"/apis/a/{i}"), timeout=5, wait_for_ready=True)
        assert [c.path for c in small.checks()] == ["/apis/a/4", "/apis/a/5", "/apis/a/6"]
