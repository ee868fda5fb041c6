"""Token budgets through a real Envoy, the real authorization service (API keys: who the consumer
is), the processing service and the quota store on the estate's PostgreSQL, in front of the fake
model: reservation before the model, settlement from `usage` (buffered and streamed), what a missing
or negative usage and a client gone mid-stream are charged, 429 with Retry-After, budgets per
consumer and per tenant, and a parallel burst that never commits more than the budget.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg
import pytest
from stoa_harness.estate import Estate, EstateOptions
from stoa_harness.wait import wait_until
from stoa_proto.bodies import DENY_BODIES, PROC_BODIES
from stoa_quota import QuotaStore, TokenCounter

AUDIENCE = "stoa-budget"
TENANT = "tok"
WINDOW_S = 3600
KEYED_BUDGET = 100
BURST_BUDGET = 100
BURST_RESERVE = 20
STREAM_DEFAULT = 50


@pytest.fixture(scope="module")
def estate(estates: Callable[..., Estate]) -> Estate:
    running = estates(
        EstateOptions(authz="service", authz_env={"STOA_AUTHZ_AUDIENCE": AUDIENCE}, proc=True), "budget"
    )
    admin = running.admin
    model = f"{running.llm.url}/v1"
    running.publish("keyed", tenant_id=TENANT, upstream_url=model, methods=["POST"], auth={"mode": "api_key"})
    admin.create_plan("free", tenant_id=TENANT, requests=10_000, window_seconds=60)
    for consumer in ("alice", "bob"):
        admin.create_consumer(consumer, tenant_id=TENANT)
        admin.subscribe(
            f"{consumer}-keyed", tenant_id=TENANT, consumer_id=consumer, api_id="keyed", plan_id="free"
        )
    admin.add_policy(
        "keyed-budget",
        "token_budget",
        {"tokens": KEYED_BUDGET, "windowSeconds": WINDOW_S, "billed": True, "per": "consumer"},
        tenant_id=TENANT,
        targets=["keyed"],
    )
    for api, tokens, default in (("streamed", 10_000, STREAM_DEFAULT), ("burst", BURST_BUDGET, 10)):
        running.publish(api, tenant_id=TENANT, upstream_url=model, methods=["POST"], auth={"mode": "none"})
        admin.add_policy(
            f"{api}-budget",
            "token_budget",
            {
                "tokens": tokens,
                "windowSeconds": WINDOW_S,
                "billed": True,
                "per": "tenant",
                "defaultMaxTokens": default,
            },
            tenant_id=TENANT,
            targets=[api],
        )
    # Not billed: while the store cannot count, requests pass uncounted (for a bounded time).
    running.publish("lenient", tenant_id=TENANT, upstream_url=model, methods=["POST"], auth={"mode": "none"})
    admin.add_policy(
        "lenient-budget",
        "token_budget",
        {"tokens": 10_000, "windowSeconds": WINDOW_S, "billed": False, "per": "tenant"},
        tenant_id=TENANT,
        targets=["lenient"],
    )
    running.publish("anon", tenant_id=TENANT, upstream_url=model, methods=["POST"], auth={"mode": "none"})
    admin.add_policy(
        "anon-budget",
        "token_budget",
        {"tokens": 1000, "windowSeconds": WINDOW_S, "per": "consumer"},
        tenant_id=TENANT,
        targets=["anon"],
    )
    admin.wait_synced()
    assert running.site is not None
    running.site.wait_authz_ready()
    return running


@pytest.fixture(scope="module")
def keys(estate: Estate) -> dict[str, str]:
    created = {c: estate.admin.create_key(c, tenant_id=TENANT)["key"] for c in ("alice", "bob")}
    estate.admin.wait_synced()
    return created


@pytest.fixture(scope="module")
def counter(estate: Estate) -> Iterator[TokenCounter]:
    store = QuotaStore(estate.database_url).open()
    yield TokenCounter(store)
    store.close()


@pytest.fixture(autouse=True)
def fresh(estate: Estate) -> None:
    estate.llm.clear()
    estate.llm.script(["Hello", " there."])


def used(counter: TokenCounter, policy: str, owner: str = "tenant") -> int:
    return counter.used(f"token_budget/{TENANT}/{policy}/{owner}", WINDOW_S)


def ask(max_tokens: int | None = None, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    return body


def post(estate: Estate, api: str, body: dict[str, Any], key: str | None = None) -> httpx.Response:
    headers = {"x-api-key": key} if key else {}
    return estate.gateway.post(estate.url(f"/apis/{api}/chat/completions"), json=body, headers=headers)


def exchanges(estate: Estate) -> int:
    assert estate.site is not None
    return len(estate.site.proc_events("ext_proc_decision"))


def test_reserved_then_settled_per_consumer_and_429_when_it_does_not_fit(
    estate: Estate, keys: dict[str, str], counter: TokenCounter
) -> None:
    alice = "consumer/alice"
    answer = post(estate, "keyed", ask(95), keys["alice"])
    assert answer.status_code == 200
    total = answer.json()["usage"]["total_tokens"]
    assert used(counter, "keyed-budget", alice) == total  # 95 reserved, settled at the usage
    # total + 95 no longer fits in 100: refused before the model, with the window's reset.
    refused = post(estate, "keyed", ask(95), keys["alice"])
    assert refused.status_code == 429
    assert refused.content == PROC_BODIES["token_budget_exceeded"]
    assert 0 < int(refused.headers["retry-after"]) <= WINDOW_S
    assert len(estate.llm.requests()) == 1
    # Another consumer's budget is its own; a smaller reservation of alice's still fits.
    assert post(estate, "keyed", ask(95), keys["bob"]).status_code == 200
    assert post(estate, "keyed", ask(100 - 2 * total), keys["alice"]).status_code == 200
    assert used(counter, "keyed-budget", alice) == 2 * total
    # A limit that is not a positive whole number is a malformed request.
    assert post(estate, "keyed", ask(-3), keys["bob"]).status_code == 400


def test_a_budget_per_consumer_without_a_consumer_is_refused(estate: Estate) -> None:
    response = post(estate, "anon", ask(10))
    assert (response.status_code, response.content) == (403, DENY_BODIES[403])
    assert estate.llm.requests() == []
    site = estate.site
    assert site is not None
    # The route's own event (an earlier exchange's may still be written after its answer left).
    wait_until(
        lambda: any(e["route"] == "anon" for e in site.proc_events("ext_proc_decision")), 10, "anon logged"
    )
    assert [e["reason"] for e in site.proc_events("ext_proc_decision") if e["route"] == "anon"] == [
        "no_consumer"
    ]


def test_missing_or_negative_usage_settles_at_the_reservation(estate: Estate, counter: TokenCounter) -> None:
    before = used(counter, "streamed-budget")
    estate.llm.script(["Hi"], usage={"prompt_tokens": 1})
    assert post(estate, "streamed", ask(30)).status_code == 200
    estate.llm.script(["Hi"], usage={"total_tokens": -7})
    assert post(estate, "streamed", ask(40)).status_code == 200
    # No max_tokens: the policy's default is reserved (and charged, the usage being unusable).
    assert post(estate, "streamed", ask()).status_code == 200
    assert used(counter, "streamed-budget") == before + 30 + 40 + STREAM_DEFAULT


def test_a_compressed_answer_settles_from_its_usage(estate: Estate, counter: TokenCounter) -> None:
    before = used(counter, "streamed-budget")
    estate.llm.script(["Hello", " there."], gzip_body=True)
    answer = post(estate, "streamed", ask(300))
    assert answer.status_code == 200
    assert answer.headers["content-encoding"] == "gzip"  # passed as the model sent it
    assert used(counter, "streamed-budget") == before + answer.json()["usage"]["total_tokens"]


def stream(estate: Estate, body: dict[str, Any]) -> str:
    with httpx.stream(
        "POST", estate.url("/apis/streamed/chat/completions"), json=body, timeout=10
    ) as response:
        assert response.status_code == 200
        return b"".join(response.iter_bytes()).decode()


def test_a_stream_settles_from_its_final_usage_chunk(estate: Estate, counter: TokenCounter) -> None:
    before = used(counter, "streamed-budget")
    text = stream(estate, ask(500, stream=True, stream_options={"include_usage": True}))
    [usage] = [json.loads(line[6:])["usage"] for line in text.splitlines() if '"usage"' in line]
    assert usage["total_tokens"] < 500
    assert used(counter, "streamed-budget") == before + usage["total_tokens"]
    # Without include_usage the stream reports none: the reservation is charged.
    assert stream(estate, ask(60, stream=True)).endswith("data: [DONE]\n\n")
    assert used(counter, "streamed-budget") == before + usage["total_tokens"] + 60


def test_a_client_gone_mid_stream_is_charged(estate: Estate, counter: TokenCounter) -> None:
    before = used(counter, "streamed-budget")
    seen = exchanges(estate)
    estate.llm.script(["one", " two", " three", " four"], pause_s=0.5)
    body = ask(70, stream=True, stream_options={"include_usage": True})
    with httpx.stream(
        "POST", estate.url("/apis/streamed/chat/completions"), json=body, timeout=10
    ) as response:
        assert response.status_code == 200
        next(response.iter_bytes())  # the first event, then the client goes away
    wait_until(lambda: exchanges(estate) > seen, 20, "the exchange ended at the service")
    # The model's stream runs on after the client left: nothing is refunded when it ends.
    wait_until(lambda: len(estate.llm.requests()) == 1, 5, "the model saw the request")
    assert used(counter, "streamed-budget") == before + 70


def test_a_parallel_burst_never_commits_more_than_the_budget(estate: Estate, counter: TokenCounter) -> None:
    url = estate.url("/apis/burst/chat/completions")

    with ThreadPoolExecutor(max_workers=30) as pool:
        # Each on a connection of its own (`httpx.post`: one httpx client shared by thirty threads
        # once read from a socket another thread had closed).
        answers = list(pool.map(lambda _: httpx.post(url, json=ask(BURST_RESERVE), timeout=10.0), range(30)))
    passed = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    assert all(a.status_code == 429 and "retry-after" in a.headers for a in refused), {
        a.status_code for a in refused
    }
    # Every reservation fitted when it was made, and each was settled at its usage (smaller than the
    # reservation here): the budget is never exceeded, and the count is exact.
    assert BURST_BUDGET // BURST_RESERVE <= len(passed) < 30
    charged = sum(a.json()["usage"]["total_tokens"] for a in passed)
    assert used(counter, "burst-budget") == charged <= BURST_BUDGET
    assert len(estate.llm.requests()) == len(passed)


def test_billed_fails_closed_while_the_store_cannot_count(estate: Estate, counter: TokenCounter) -> None:
    assert estate.site is not None
    seen = exchanges(estate)
    # The counters' table locked: every reservation waits past the store's statement timeout.
    with psycopg.connect(estate.database_url) as blocker:
        blocker.execute("LOCK TABLE stoa_quota_counters IN ACCESS EXCLUSIVE MODE")
        billed = post(estate, "streamed", ask(10))
        lenient = post(estate, "lenient", ask(10))
        blocker.rollback()
    assert (billed.status_code, billed.content) == (503, DENY_BODIES[503])
    assert billed.headers["retry-after"] == "1"
    assert lenient.status_code == 200
    assert len(estate.llm.requests()) == 1, "the billed request reached the model"
    assert used(counter, "lenient-budget") == 0  # passed uncounted

    def reasons() -> dict[str, str]:
        # Those two routes' events (an earlier test's exchange may still be written after its answer,
        # and events are written in batches).
        events = estate.site.proc_events("ext_proc_decision")[seen:]  # type: ignore[union-attr]
        return {e["route"]: e["reason"] for e in events if e["route"] in ("streamed", "lenient")}

    logged = wait_until(lambda: len(found := reasons()) == 2 and found, 10, "both exchanges logged")
    assert logged == {"streamed": "quota_unavailable", "lenient": "allowed"}
    # The store counts again: so does the non-billed budget.
    answer = post(estate, "lenient", ask(10))
    assert answer.status_code == 200
    assert used(counter, "lenient-budget") == answer.json()["usage"]["total_tokens"]
