"""The operator endpoint over a real socket; its metrics read back with prometheus-client's parser."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.parser import text_string_to_metric_families
from stoa_ops.endpoint import CONTENT_TYPE, OperatorEndpoint


class State:
    not_ready: str | None = "no policy set yet"


@pytest.fixture
async def endpoint() -> AsyncIterator[tuple[str, State, Counter]]:
    state = State()
    registry = CollectorRegistry()
    checks = Counter("svc_checks", "Checks answered", ["decision"], registry=registry)
    Gauge("svc_ready", "1 when ready", registry=registry).set_function(lambda: state.not_ready is None)
    endpoint = OperatorEndpoint(
        lambda: (state.not_ready, {"sets": 0 if state.not_ready else 1}),
        registry,
        {"/.well-known/jwks.json": ("application/json", b'{"keys":[]}')},
    )
    server = await endpoint.start("127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}", state, checks
    server.close()
    await server.wait_closed()


async def test_live_ready_metrics_documents(endpoint: tuple[str, State, Counter]) -> None:
    url, state, checks = endpoint
    checks.labels("allow").inc(3)
    checks.labels('de"ny').inc()
    async with httpx.AsyncClient(base_url=url) as client:
        live = await client.get("/health/live")
        not_ready = await client.get("/health/ready")
        state.not_ready = None
        ready = await client.get("/health/ready")
        scraped = await client.get("/metrics")
        jwks = await client.get("/.well-known/jwks.json")
        head = await client.head("/health/live")
        missing = await client.get("/nope")
        posted = await client.post("/metrics")

    assert live.status_code == 200
    assert live.json() == {"status": "live"}
    assert not_ready.status_code == 503
    assert not_ready.json() == {"status": "not_ready", "reason": "no policy set yet", "sets": 0}
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "sets": 1}
    assert scraped.status_code == 200
    assert scraped.headers["content-type"] == CONTENT_TYPE
    families = {f.name: f for f in text_string_to_metric_families(scraped.text)}
    assert families["svc_checks"].type == "counter"
    assert {(s.name, s.labels["decision"]): s.value for s in families["svc_checks"].samples} == {
        ("svc_checks_total", "allow"): 3,
        ("svc_checks_total", 'de"ny'): 1,
    }
    assert [s.value for s in families["svc_ready"].samples] == [1]
    assert not any(name.endswith("_created") for name in families), "no _created series"
    assert jwks.json() == {"keys": []}
    assert head.status_code == 200
    assert head.content == b""
    assert missing.status_code == 404
    assert posted.status_code == 405


async def test_a_garbled_request_gets_400(endpoint: tuple[str, State, Counter]) -> None:
    host, port = endpoint[0].removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GARBAGE\r\n\r\n")
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()

    assert answer.startswith(b"HTTP/1.1 400 ")
    assert json.loads(answer.split(b"\r\n\r\n", 1)[1]) == {"error": "bad_request"}


async def test_a_failing_readiness_answers_500_and_the_endpoint_keeps_serving() -> None:
    def broken() -> tuple[str | None, dict[str, object]]:
        raise RuntimeError("state unreadable")

    server = await OperatorEndpoint(broken, CollectorRegistry()).start("127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/health/ready")).status_code == 500
            assert (await client.get("/health/live")).status_code == 200
    finally:
        server.close()
        await server.wait_closed()
