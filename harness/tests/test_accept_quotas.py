"""Quotas through a real Envoy and the real `stoa-authz`, counted in a PostgreSQL of their own that
the tests stop: a billed plan is exact under a concurrent burst and fails closed (503) without its
database; a non-billed plan degrades within its overshoot and time, then denies; 429 carries
Retry-After from the window's reset and the RateLimit fields. A billed token budget (the processing
service) counted in the same store: 503 without it, a reservation standing whole, counting again."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import wait_until
from stoa_proto.bodies import DENY_BODIES
from stoa_quota import QuotaStore, TokenCounter

TENANT = "metered"
PATH = "/apis/meter/items"
OVERSHOOT = 3
DEGRADED_MAX_S = 2.0


@pytest.fixture(scope="module")
def quota_pg() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


@pytest.fixture(scope="module")
def estate(quota_pg: EmbeddedPostgres, estates: Callable[..., Estate]) -> Estate:
    quotas = quota_pg.create_database("quotas")
    options = EstateOptions(
        authz="service",
        authz_env={
            "STOA_AUTHZ_AUDIENCE": "stoa-quotas",
            "STOA_AUTHZ_DATABASE_URL": quotas,
            "STOA_AUTHZ_QUOTA_DEGRADED_OVERSHOOT": str(OVERSHOOT),
            "STOA_AUTHZ_QUOTA_DEGRADED_MAX_S": str(DEGRADED_MAX_S),
            "STOA_AUTHZ_QUOTA_TIMEOUT_S": "0.3",
        },
        # Token budgets counted in the same stoppable store.
        proc=True,
        proc_env={"STOA_PROC_DATABASE_URL": quotas},
    )
    running = estates(options, "estate-quotas")
    admin = running.admin
    admin.create_tenant(TENANT, exist_ok=True)
    running.publish("meter", tenant_id=TENANT, auth={"mode": "api_key"})
    running.publish(
        "tokens",
        tenant_id=TENANT,
        upstream_url=f"{running.llm.url}/v1",
        methods=["POST"],
        auth={"mode": "none"},
    )
    admin.add_policy(
        "tokens-budget",
        "token_budget",
        {"tokens": 10_000, "windowSeconds": 3600, "billed": True, "per": "tenant"},
        tenant_id=TENANT,
        targets=["tokens"],
    )
    plans = {"burst": (10, 300, True), "pair": (2, 60, True), "free": (1000, 60, False)}
    for plan_id, (requests, window_seconds, billed) in plans.items():
        admin.create_plan(
            plan_id, tenant_id=TENANT, requests=requests, window_seconds=window_seconds, billed=billed
        )
    admin.wait_synced()
    running.started_site.wait_authz_ready()
    return running


def subscribed_key(estate: Estate, plan_id: str) -> str:
    """A key of a new consumer subscribed to the API under `plan_id`."""
    consumer = f"c-{plan_id}-{time.monotonic_ns()}"
    estate.admin.create_consumer(consumer, tenant_id=TENANT)
    estate.admin.subscribe(
        f"s-{consumer}", tenant_id=TENANT, consumer_id=consumer, api_id="meter", plan_id=plan_id
    )
    key = str(estate.admin.create_key(consumer, tenant_id=TENANT)["key"])
    estate.admin.wait_synced()
    return key


def in_one_window(window_s: int, needed_s: float = 15.0) -> None:
    """Until the clock's current `window_s`-second slot (the quota's fixed window) has `needed_s` left:
    requests that must count in one window do not straddle two."""
    wait_until(lambda: window_s - time.time() % window_s >= needed_s, needed_s + 5, "a window with time left")


def get(estate: Estate, key: str) -> httpx.Response:
    return estate.gateway.get(estate.url(PATH), headers={"x-api-key": key})


def test_billed_quota_is_exact_under_a_concurrent_burst(estate: Estate) -> None:
    key = subscribed_key(estate, "burst")
    url = estate.url(PATH)
    in_one_window(300)
    with (
        httpx.Client(timeout=10, limits=httpx.Limits(max_connections=100)) as client,
        ThreadPoolExecutor(100) as pool,
    ):
        statuses = list(
            pool.map(lambda _: client.get(url, headers={"x-api-key": key}).status_code, range(100))
        )
    assert statuses.count(200) == 10, statuses
    assert set(statuses) <= {200, 429, 503}
    assert get(estate, key).status_code == 429


def test_429_carries_retry_after_from_the_window_and_ratelimit_fields(estate: Estate) -> None:
    key = subscribed_key(estate, "pair")
    in_one_window(60)
    first = get(estate, key)
    assert first.status_code == 200, first.text
    assert first.headers["ratelimit-policy"] == '"pair";q=2;w=60'
    remaining, reset = first.headers["ratelimit"].split(";")[1:]
    assert remaining == "r=1"
    assert 1 <= int(reset.removeprefix("t=")) <= 60
    assert get(estate, key).status_code == 200
    denied = get(estate, key)
    assert denied.status_code == 429
    assert denied.content == DENY_BODIES[429]
    retry_after = int(denied.headers["retry-after"])
    assert 1 <= retry_after <= 60
    assert denied.headers["ratelimit"] == f'"pair";r=0;t={retry_after}'
    # The window is the clock's 60-second slot: Retry-After is what is left of it.
    assert abs(retry_after - (60 - time.time() % 60)) <= 2
    assert estate.last_authz_reason() == "quota_exceeded"


def test_postgres_stopped_billed_503_non_billed_bounded_then_denied(
    estate: Estate, quota_pg: EmbeddedPostgres
) -> None:
    billed = subscribed_key(estate, "burst")
    spent, spare = subscribed_key(estate, "free"), subscribed_key(estate, "free")
    assert get(estate, billed).status_code == 200
    assert get(estate, spent).status_code == 200
    events = estate.started_site.authz_events
    degraded_before = len(events("quota flush failed: degraded mode"))
    expired_before = len(events("quota degraded mode expired: denying"))
    quota_pg.stop_server()
    try:
        unavailable = get(estate, billed)
        assert unavailable.status_code == 503
        assert unavailable.content == DENY_BODIES[503]
        assert estate.last_authz_reason() == "quota_unavailable"
        wait_until(
            lambda: len(events("quota flush failed: degraded mode")) > degraded_before,
            5,
            "the non-billed counters to notice",
        )
        degraded_at = time.monotonic()
        statuses = [get(estate, spent).status_code for _ in range(OVERSHOOT + 2)]
        assert statuses == [200] * OVERSHOOT + [503, 503]
        assert get(estate, spare).status_code == 200
        # Past the bounded time nothing is served, even by a counter with overshoot left.
        wait_until(
            lambda: len(events("quota degraded mode expired: denying")) > expired_before,
            DEGRADED_MAX_S + 10,
            "the degraded mode's time to run out",
        )
        assert time.monotonic() - degraded_at >= DEGRADED_MAX_S - 0.5
        assert get(estate, spare).status_code == 503
        assert estate.last_authz_reason() == "quota_unavailable"
    finally:
        quota_pg.resume()
    wait_until(lambda: get(estate, billed).status_code == 200, 10, "billed counting again")
    wait_until(lambda: get(estate, spare).status_code == 200, 10, "non-billed counting again")


def test_a_token_budget_without_its_store_is_503_then_counts_again_and_charges_once(
    estate: Estate, quota_pg: EmbeddedPostgres
) -> None:
    """A reservation made before the store went down and settled while it is down stands whole (never
    less, never twice); meanwhile a billed budget lets nothing reach the model; once the store is
    back, counting resumes by itself."""

    def ask(max_tokens: int) -> httpx.Response:
        body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
        return estate.gateway.post(estate.url("/apis/tokens/chat/completions"), json=body)

    def used() -> int:
        store = QuotaStore(quota_pg.dsn_for("quotas")).open()
        try:
            return TokenCounter(store).used(f"token_budget/{TENANT}/tokens-budget/tenant", 3600)
        finally:
            store.close()

    def counted() -> httpx.Response | None:
        answer = ask(30)
        return answer if answer.status_code == 200 else None

    # Counting (an earlier test restarted the store: a first reservation may find its connection lost).
    wait_until(counted, 10, "token budgets counting")
    before = used()
    estate.llm.clear()
    estate.llm.script(["slow"], pause_s=2.5)
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(ask, 40)
        wait_until(lambda: len(estate.llm.requests()) == 1, 10, "the model got the reserved request")
        quota_pg.stop_server()
        try:
            assert not pending.done(), "answered before the store was down: nothing to test"
            answered = pending.result(timeout=15)
            assert answered.status_code == 200  # the answer is the client's; its settlement failed
            estate.llm.script(["never"])
            refused = ask(40)
            assert (refused.status_code, refused.content) == (503, DENY_BODIES[503])
            assert len(estate.llm.requests()) == 1, "a request reached the model uncounted"
        finally:
            quota_pg.resume()
    estate.llm.script(["again"])
    healed = wait_until(counted, 10, "token budgets counting again")
    # The first request's 40 reserved stand (its usage was never settled), the one answered afterwards
    # is charged its usage: nothing twice, nothing left reserved.
    assert answered.json()["usage"]["total_tokens"] < 40
    assert used() - before == 40 + healed.json()["usage"]["total_tokens"]
