"""SSE delivery: event `inventory` with id = generation and the same JSON as /config, resume with
Last-Event-ID, keep-alive comments, and fan-out across CP processes through LISTEN/NOTIFY."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import httpx
import pytest
from stoa_cp.events import LISTENER_NAME
from stoa_harness.cp_client import AsyncCPClient
from stoa_harness.ports import free_port
from stoa_harness.wait import GiveUp, wait_until_async


@dataclass
class Event:
    event: str = ""
    id: str = ""
    data: str = ""
    comments: list[str] = field(default_factory=list)


class SseReader:
    """A minimal text/event-stream reader that also surfaces comments (keep-alives)."""

    def __init__(self, response: httpx.Response) -> None:
        self.lines = response.aiter_lines()
        self.comments: list[str] = []

    async def next_event(self, within: float = 10) -> Event:
        async def read() -> Event:
            current = Event()
            data: list[str] = []
            async for line in self.lines:
                if line == "":
                    if data or current.event:
                        current.data = "\n".join(data)
                        return current
                    continue
                if line.startswith(":"):
                    self.comments.append(line)
                    continue
                name, _, value = line.partition(":")
                value = value.removeprefix(" ")
                if name == "event":
                    current.event = value
                elif name == "id":
                    current.id = value
                elif name == "data":
                    data.append(value)
            raise AssertionError("stream ended")

        return await asyncio.wait_for(read(), within)

    async def comment(self, within: float) -> str:
        async def read() -> str:
            async for line in self.lines:
                if line.startswith(":"):
                    return line
            raise AssertionError("stream ended")

        return await asyncio.wait_for(read(), within)


@contextlib.asynccontextmanager
async def stream(
    url: str, gateway_id: str, credential: str, last_id: str | None = None
) -> AsyncIterator[SseReader]:
    headers = {"accept": "text/event-stream"}
    if last_id is not None:
        headers["last-event-id"] = last_id
    async with (
        AsyncCPClient(url, credential, timeout=30) as client,
        client.http.stream("GET", f"/v1/gateways/{gateway_id}/events", headers=headers) as response,
    ):
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        yield SseReader(response)


async def test_stream_sends_current_then_each_change_with_config_json(api, cp) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    async with stream(cp.url, gateway_id, credential) as sse:
        first = await sse.next_event()
        assert (first.event, first.id) == ("inventory", "1")
        assert json.loads(first.data) == await api.inventory(gateway_id, credential=credential)

        api_id = await api.new_api(tenant_id)
        generation = await api.deploy(api_id, gateway_id)
        second = await sse.next_event()
        assert second.id == str(generation) == "2"
        doc = json.loads(second.data)
        assert doc == await api.inventory(gateway_id, credential=credential)
        assert [r["route_id"] for r in doc["routes"]] == [api_id]

        # A change on another gateway is not streamed here; the next event is this gateway's next change.
        other, _ = await api.new_gateway()
        await api.deploy(api_id, other)
        await api.undeploy(api_id, gateway_id)
        third = await sse.next_event()
        assert third.id == "3"
        assert json.loads(third.data)["tombstones"] == [{"route_id": api_id, "generation": "3"}]


async def test_resume_with_last_event_id_sends_only_newer_generations(api, cp) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    api_id = await api.new_api(tenant_id)
    await api.deploy(api_id, gateway_id)  # generation 2

    async with stream(cp.url, gateway_id, credential, last_id="1") as sse:
        assert (await sse.next_event()).id == "2"

    async with stream(cp.url, gateway_id, credential, last_id="2") as sse:
        # Nothing above 2 yet: only keep-alive comments until the next change.
        assert (await sse.comment(within=5)).startswith(":")
        await api.undeploy(api_id, gateway_id)
        event = await sse.next_event()
        assert event.id == "3"
        assert json.loads(event.data)["generation"] == "3"

    async with cp.client(None) as client:
        bad = await client.answer(
            "GET",
            f"/v1/gateways/{gateway_id}/events",
            headers={"authorization": f"Bearer {credential}", "last-event-id": "abc"},
        )
    assert bad.status_code == 422
    assert bad.json()["errors"][0]["field"] == "Last-Event-ID"


async def test_lost_listen_connection_is_reopened_and_streams_catch_up(api, cp) -> None:
    """The LISTEN connection dropping loses the notifications of that moment; after it comes back,
    every open stream re-reads its generation, so the change made meanwhile is still streamed."""
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    api_id = await api.new_api(tenant_id)
    conn = await asyncpg.connect(cp.dsn)
    try:
        async with stream(cp.url, gateway_id, credential) as sse:
            assert (await sse.next_event()).id == "1"
            killed = await conn.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE application_name = $1 AND datname = current_database()",
                LISTENER_NAME,
            )
            assert killed == 1
            # Committed while nobody listens: its NOTIFY reaches no one.
            generation = await api.deploy(api_id, gateway_id)
            event = await sse.next_event(within=20)
            assert event.id == str(generation) == "2"
            assert [r["route_id"] for r in json.loads(event.data)["routes"]] == [api_id]

            async def listening_again() -> bool:
                count = await conn.fetchval(
                    "SELECT count(*) FROM pg_stat_activity"
                    " WHERE application_name = $1 AND datname = current_database()",
                    LISTENER_NAME,
                )
                return bool(count == 1)

            await wait_until_async(listening_again, 20, "the CP to LISTEN again")
            # And later changes arrive through the new LISTEN connection.
            await api.undeploy(api_id, gateway_id)
            assert (await sse.next_event(within=10)).id == "3"
    finally:
        await conn.close()


async def test_several_changes_while_away_resume_with_the_latest_complete_state(api, cp) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, credential = await api.new_gateway()
    apis = [await api.new_api(tenant_id) for _ in range(3)]
    for api_id in apis:
        await api.deploy(api_id, gateway_id)  # generations 2, 3, 4
    async with stream(cp.url, gateway_id, credential, last_id="2") as sse:
        event = await sse.next_event()
    assert event.id == "4"
    assert sorted(r["route_id"] for r in json.loads(event.data)["routes"]) == sorted(apis)


def _start_cp_process(dsn: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "STOA_CP_DATABASE_URL": dsn,
        "STOA_CP_ADMIN_TOKENS": "test-admin-token,other",
        "STOA_CP_HOST": "127.0.0.1",
        "STOA_CP_PORT": str(port),
        "STOA_CP_SSE_PING_S": "1",
        "STOA_CP_LOG_LEVEL": "warning",
    }
    proc = subprocess.Popen([sys.executable, "-m", "stoa_cp"], env=env)
    return proc, f"http://127.0.0.1:{port}"


async def _wait_ready(proc: subprocess.Popen[bytes], url: str) -> None:
    async with AsyncCPClient(url, None, timeout=2) as client:

        async def ready() -> bool:
            if proc.poll() is not None:
                raise GiveUp("CP process exited during start-up")
            return (await client.answer("GET", "/health/ready")).status_code == 200

        await wait_until_async(ready, 60, f"the CP at {url} to be ready")


@pytest.fixture
async def two_cps(pg) -> AsyncIterator[tuple[str, str]]:
    dsn = pg.create_database(f"cp_fanout_{os.getpid()}")
    started = [_start_cp_process(dsn) for _ in range(2)]
    try:
        for proc, url in started:
            await _wait_ready(proc, url)
        yield started[0][1], started[1][1]
    finally:
        for proc, _ in started:
            proc.terminate()
        for proc, _ in started:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def test_two_cp_processes_share_changes_through_postgres(two_cps) -> None:
    url_a, url_b = two_cps
    async with AsyncCPClient(url_a, "test-admin-token", gateway_id="gw-fan") as a:
        await a.create_tenant("fan", "Fan")
        credential = (await a.create_gateway("gw-fan", "G"))["credential"]
        await a.create_api("fan-api", tenant_id="fan", name="x", upstream_url="http://127.0.0.1:9")

        async with stream(url_b, "gw-fan", credential) as sse:
            assert (await sse.next_event()).id == "1"
            # The change goes through process A; process B streams it.
            assert await a.deploy("fan-api") == 2
            event = await sse.next_event(within=10)
            assert event.id == "2"
            assert [r["route_id"] for r in json.loads(event.data)["routes"]] == ["fan-api"]
            # And the keep-alive comment interval comes from the settings (1 s here).
            assert (await sse.comment(within=5)).startswith(":")
