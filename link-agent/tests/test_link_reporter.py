"""The reporter: retries while the CP is down, and the latest report supersedes older ones."""

from __future__ import annotations

import asyncio
import json

import httpx
from google.protobuf import json_format
from stoa_link.reporter import Reporter
from stoa_ops.backoff import Backoff
from stoa_proto import inventory_pb2
from stoa_translate import TranslateOptions


def report(generation: int, status: int = inventory_pb2.SYNCED) -> inventory_pb2.SyncReport:
    return inventory_pb2.SyncReport(generation=generation, status=status, snapshot_version=f"v{generation}")


async def deliver(reporter: Reporter) -> None:
    task = asyncio.create_task(reporter.run())
    try:
        await asyncio.wait_for(reporter.wait_idle(), 5)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await reporter.aclose()


async def test_retries_until_the_cp_takes_the_report() -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        if len(bodies) < 2:
            bodies.append({})
            return httpx.Response(503)
        bodies.append(json.loads(request.content))
        assert request.url.path == "/v1/gateways/gw/sync-reports"
        return httpx.Response(202)

    reporter = Reporter(
        "http://cp", "gw", "secret", transport=httpx.MockTransport(handler), backoff=Backoff(0.001, 0.002)
    )
    reporter.submit(report(3, inventory_pb2.FAILED))
    await deliver(reporter)
    assert bodies[-1] == {"gateway_id": "gw", "generation": "3", "status": "FAILED", "snapshot_version": "v3"}
    assert [r.generation for r in reporter.delivered] == [3]


async def test_a_later_report_supersedes_one_not_yet_delivered() -> None:
    reporter: Reporter
    generations: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        generations.append(int(body["generation"]))
        if body["generation"] == "4":
            reporter.submit(report(5))  # arrives while the CP is still down
            return httpx.Response(502)
        return httpx.Response(202)

    reporter = Reporter(
        "http://cp", "gw", "secret", transport=httpx.MockTransport(handler), backoff=Backoff(0.001, 0.002)
    )
    reporter.submit(report(4))
    await deliver(reporter)
    assert generations == [4, 5]
    assert [r.generation for r in reporter.delivered] == [5]


async def test_a_report_the_cp_rejects_as_invalid_is_not_retried_forever() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(403, json={"title": "another gateway's credential"})

    reporter = Reporter(
        "http://cp", "gw", "secret", transport=httpx.MockTransport(handler), backoff=Backoff(0.001, 0.002)
    )
    reporter.submit(report(1))
    await deliver(reporter)
    assert calls == 1
    assert not reporter.delivered


async def test_every_report_carries_the_translation_settings() -> None:
    bodies: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(202)

    options = TranslateOptions(listener_port=12345, ext_authz_address="127.0.0.1:7000")
    reporter = Reporter(
        "http://cp", "gw", "secret", transport=httpx.MockTransport(handler), settings=options.to_settings()
    )
    reporter.submit(report(4))
    await deliver(reporter)
    reported = json_format.ParseDict(bodies[-1]["settings"], inventory_pb2.TranslateSettings())
    assert TranslateOptions.from_settings(reported) == options
