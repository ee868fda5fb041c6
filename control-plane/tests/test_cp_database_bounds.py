"""A database that stops answering never hangs the CP: every wait is bounded, past a bound the CP
answers 503 with Retry-After and a problem body, and a write it refused (or whose client gave up before
its COMMIT) is never stored later. Each test runs on its own PostgreSQL, frozen with SIGSTOP or stopped
cleanly, so no other test shares its faults."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator

import httpx
import pytest
from stoa_harness.cp_client import AsyncCPClient, fresh_id
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import wait_until_async

PROBLEM = "application/problem+json"
BOUNDS = {
    "db_connect_timeout_s": 1.0,
    "db_acquire_timeout_s": 1.0,
    "db_statement_timeout_s": 1.5,
    "db_transaction_timeout_s": 3.0,
    "db_retry_after_s": 7,
    "ready_timeout_s": 1.0,
}
# The longest a call may take while the database is frozen: its bounds, plus room for a loaded machine.
WORST_S = 1.0 + 1.5 + 2.5


@pytest.fixture
def own_pg() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


def assert_unavailable(response: httpx.Response, elapsed_s: float) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.text
    assert response.headers["retry-after"] == "7"
    assert response.json()["errors"][0]["field"] == "database"
    assert elapsed_s < WORST_S, f"answered after {elapsed_s:.1f}s"


async def timed(call: asyncio.Future[httpx.Response] | object) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = await call  # type: ignore[misc]
    return response, time.monotonic() - start


async def test_a_frozen_database_gets_503_within_the_bounds_and_a_refused_write_is_never_stored(
    own_pg, cp_factory
) -> None:
    cp = await cp_factory(own_pg.dsn, **BOUNDS)
    async with cp.client() as admin:
        assert (
            await admin.answer("POST", "/v1/tenants", json={"tenant_id": "before", "name": "B"})
        ).status_code == 201
        with own_pg.frozen():
            ready, read, write = await asyncio.gather(
                timed(admin.answer("GET", "/health/ready")),
                timed(admin.answer("GET", "/v1/tenants")),
                timed(admin.answer("POST", "/v1/tenants", json={"tenant_id": "during", "name": "D"})),
            )
            assert ready[0].status_code == 503, ready[0].text
            assert ready[1] < 1.0 + 1.5, f"/health/ready answered after {ready[1]:.1f}s"
            assert_unavailable(*read)
            assert_unavailable(*write)
            # Still frozen, a second round: the CP did not leave itself stuck behind the first one.
            again = await timed(admin.answer("GET", "/v1/gateways"))
            assert_unavailable(*again)
        await api_ready(admin)
        names = [t["tenant_id"] for t in (await admin.answer("GET", "/v1/tenants")).json()]
        assert names == ["before"]
        retried = await admin.answer("POST", "/v1/tenants", json={"tenant_id": "during", "name": "D"})
        assert retried.status_code == 201, retried.text


async def api_ready(admin: AsyncCPClient) -> None:
    async def ready() -> bool:
        return (await admin.answer("GET", "/health/ready")).status_code == 200

    await wait_until_async(ready, 30, "the CP ready again")


async def test_a_write_whose_client_gave_up_before_the_commit_is_not_stored(
    own_pg, cp_factory, caplog
) -> None:
    # Bounds longer than the client's patience: the CP is still waiting when the database returns.
    cp = await cp_factory(
        own_pg.dsn, **{**BOUNDS, "db_statement_timeout_s": 20.0, "db_transaction_timeout_s": 30.0}
    )
    caplog.set_level(logging.INFO, logger="stoa_cp")
    async with cp.client() as admin:
        with own_pg.frozen(), pytest.raises(httpx.ReadTimeout):
            await admin.answer("POST", "/v1/tenants", json={"tenant_id": "gave-up", "name": "G"}, timeout=0.5)
        # The database answers again; the CP, still in its bounds, finds its client gone.
        await wait_until_async(
            lambda: any("client gone" in r.getMessage() for r in caplog.records), 30, "the CP to roll back"
        )
        names = [t["tenant_id"] for t in (await admin.answer("GET", "/v1/tenants")).json()]
        assert "gave-up" not in names
        again = await admin.answer("POST", "/v1/tenants", json={"tenant_id": "gave-up", "name": "G"})
        assert again.status_code == 201, again.text


async def test_a_cleanly_stopped_database_gets_503_not_500(own_pg, cp_factory) -> None:
    cp = await cp_factory(own_pg.dsn, **BOUNDS)
    async with cp.client() as admin:
        own_pg.stop_server()
        for call in (
            admin.answer("GET", "/v1/tenants"),
            admin.answer("POST", "/v1/tenants", json={"tenant_id": "after", "name": "A"}),
            admin.answer("GET", "/v1/gateways/gw/status"),
        ):
            assert_unavailable(*(await timed(call)))
        assert (await admin.answer("GET", "/health/ready")).status_code == 503


async def test_a_repeated_create_with_the_same_body_answers_the_stored_resource(api) -> None:
    tenant_id = await api.new_tenant()
    gateway_id, _ = await api.new_gateway()
    api_id = await api.new_api(tenant_id)
    await api.deploy(api_id, gateway_id)
    generation = await api.generation(gateway_id)
    key = {"kty": "OKP", "crv": "Ed25519", "kid": "k1", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}
    other_key = {**key, "kid": "k2"}
    api_fields = {"name": "API", "upstream_url": "http://127.0.0.1:9000", "methods": ["GET"]}
    policy = {"type": "rate_limit", "config": {"maxRequests": 5, "intervalSeconds": 1}}
    cases = [
        ("/v1/tenants", {"tenant_id": "again-t", "name": "T"}, {"name": "U"}),
        ("/v1/gateways", {"gateway_id": "again-gw", "name": "G"}, {"name": "H"}),
        (f"/v1/tenants/{tenant_id}/apis", {"api_id": "again-api", **api_fields}, {"methods": ["POST"]}),
        (
            f"/v1/tenants/{tenant_id}/policies",
            {"policy_id": fresh_id("p"), "scope": "tenant", **policy},
            {"config": {"maxRequests": 6, "intervalSeconds": 1}},
        ),
        (
            f"/v1/gateways/{gateway_id}/policies",
            {"policy_id": fresh_id("p"), "type": "cors", "config": {"allowedOrigins": ["https://a.example"]}},
            {"config": {"allowedOrigins": ["https://b.example"]}},
        ),
        (
            f"/v1/tenants/{tenant_id}/issuers",
            {"issuer": "https://again.example", "jwks": {"keys": [key]}},
            {"jwks": {"keys": [other_key]}},
        ),
    ]
    for path, body, change in cases:
        first = await api.answer("POST", path, json=body)
        assert first.status_code == 201, (path, first.text)
        again = await api.answer("POST", path, json=body)
        assert again.status_code == 200, (path, again.text)
        expected = {**first.json(), "credential": None} if "credential" in first.json() else first.json()
        assert again.json() == expected, path
        different = await api.answer("POST", path, json={**body, **change})
        assert different.status_code == 409, (path, different.text)
    # Two tenant policies and an issuer were created; the repeats added no generation of their own.
    assert await api.generation(gateway_id) == generation + 3
