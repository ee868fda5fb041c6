"""The token-budget phase on its own: what is reserved for a request, which usage settles, a stream's
usage found across chunk boundaries, and the failure modes of billed and non-billed budgets."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator

import pytest
from envoy.service.ext_proc.v3.external_processor_pb2 import HttpBody, HttpHeaders, ProcessingRequest
from stoa_proc.budget import Budget, Budgets, StreamUsage, compile_budget, requested, usage_of
from stoa_proc.log import DecisionLog
from stoa_proc.policy import PolicyStore, compile_policy_set
from stoa_proc.process import ProcessingService
from stoa_proc.reasons import Deny, Reason
from stoa_proc.rules import PolicyError
from stoa_proto import proc_pb2
from stoa_proto.processing import ROUTE_METADATA, VERSION_METADATA
from stoa_quota import Outcome, QuotaUnavailable, Reservation, Window

BUDGET = Budget("p", tokens=100, window_seconds=60, billed=True, per="tenant", default_max_tokens=16)


def _rule(policy_id: str = "p", **budget: object) -> proc_pb2.TokenBudgetRule:
    fields = {"tokens": 100, "window_seconds": 60, "per": "tenant", "default_max_tokens": 16, **budget}
    return proc_pb2.TokenBudgetRule(policy_id=policy_id, budget=proc_pb2.TokenBudget(**fields))


def test_a_rule_in_the_translators_normal_form_compiles() -> None:
    assert compile_budget(_rule(billed=True)) == BUDGET


@pytest.mark.parametrize(
    ("rule", "named"),
    [
        (_rule(policy_id=""), "policy id"),
        (_rule(tokens=0), "tokens"),
        (_rule(window_seconds=0), "windowSeconds"),
        (_rule(per="everyone"), "per"),
        (_rule(default_max_tokens=101), "defaultMaxTokens"),
        (_rule(default_max_tokens=0), "defaultMaxTokens"),  # the translator always fills it in
    ],
)
def test_the_service_refuses_what_the_translator_refuses(rule: proc_pb2.TokenBudgetRule, named: str) -> None:
    with pytest.raises(PolicyError, match=named):
        compile_budget(rule)


def test_reservation_of_a_request() -> None:
    assert requested({"max_tokens": 40}, BUDGET) == 40
    assert requested({"max_completion_tokens": 30, "max_tokens": 40}, BUDGET) == 30
    assert requested({"messages": []}, BUDGET) == 16
    assert requested({"max_tokens": None}, BUDGET) == 16
    # Each of `n` choices may take the limit: a burst of such requests cannot overshoot the budget
    # by more than the reservations.
    assert requested({"max_tokens": 40, "n": 3}, BUDGET) == 120
    assert requested({"n": 2}, BUDGET) == 32
    assert requested({"max_tokens": 40, "n": None}, BUDGET) == 40
    # A completion generates `best_of` candidates to return `n` of them.
    assert requested({"max_tokens": 40, "n": 1, "best_of": 20}, BUDGET) == 800
    assert requested({"max_tokens": 40, "n": 3, "best_of": 2}, BUDGET) == 120
    for bad in (
        {"max_tokens": 0},
        {"max_tokens": -1},
        {"max_tokens": 2.5},
        {"max_tokens": True},
        [],
        {"max_tokens": 4, "n": 0},
        {"n": -2},
        {"n": "3"},
        {"n": 1.5},
        {"best_of": 0},
    ):
        with pytest.raises(Deny) as denied:
            requested(bad, BUDGET)
        assert denied.value.reason is Reason.MALFORMED_BODY


def test_usage_that_settles() -> None:
    assert usage_of({"usage": {"total_tokens": 12}}) == 12
    assert usage_of({"usage": {"total_tokens": 0}}) == 0
    for unusable in (
        {"usage": {"total_tokens": -1}},
        {"usage": {"prompt_tokens": 3}},
        {"usage": None},
        [],
        {},
    ):
        assert usage_of(unusable) is None
    assert usage_of({"usage": {"total_tokens": True}}) is None


def test_a_stream_usage_split_across_chunks() -> None:
    reader = StreamUsage()
    event = b'data: {"choices":[],"usage":{"total_tokens":42}}\n\n'
    reader.feed(b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n' + event[:20])
    assert reader.total is None
    reader.feed(event[20:] + b"data: [DONE]\n\n")
    assert reader.total == 42


class Counter:
    def __init__(self, fail: bool = False, fits: bool = True) -> None:
        self.fail = fail
        self.fits = fits

    def reserve(self, key: str, amount: int, limit: int, window_seconds: int) -> Reservation:
        if self.fail:
            raise QuotaUnavailable("down")
        return Reservation(key, amount, Outcome(self.fits, limit, 0, Window(window_seconds, 1, 7.2)))


def test_exhausted_is_429_with_the_window_reset() -> None:
    budgets = Budgets(Counter(fits=False), degraded_s=5)  # type: ignore[arg-type]
    with pytest.raises(Deny) as denied:
        budgets.reserve(BUDGET, "k", 10)
    assert (denied.value.reason, denied.value.retry_after) == (Reason.TOKEN_BUDGET_EXCEEDED, 8)


def test_store_unreachable_billed_at_once_non_billed_after_the_degraded_time() -> None:
    now = [100.0]
    budgets = Budgets(Counter(fail=True), degraded_s=5, clock=lambda: now[0])  # type: ignore[arg-type]
    with pytest.raises(Deny) as denied:
        budgets.reserve(BUDGET, "k", 10)
    assert denied.value.reason is Reason.QUOTA_UNAVAILABLE
    lax = Budget("q", 100, 60, billed=False, per="tenant", default_max_tokens=16)
    assert budgets.reserve(lax, "k", 10) is None  # passed uncounted
    now[0] += 6
    with pytest.raises(Deny):
        budgets.reserve(lax, "k", 10)
    with pytest.raises(Deny) as none:
        Budgets(None, degraded_s=5).reserve(lax, "k", 10)
    assert none.value.reason is Reason.QUOTA_UNAVAILABLE


class HeldCounter:
    """A store whose reservations wait until the test lets them go; what was charged, by key."""

    def __init__(self) -> None:
        self.reserving = threading.Event()
        self.go = threading.Event()
        self.charged: dict[str, int] = {}
        self.settled = threading.Event()

    def reserve(self, key: str, amount: int, limit: int, window_seconds: int) -> Reservation:
        self.reserving.set()
        self.go.wait(10)
        self.charged[key] = self.charged.get(key, 0) + amount
        return Reservation(key, amount, Outcome(True, limit, limit - amount, Window(window_seconds, 1, 7.2)))

    def settle(self, reservation: Reservation, used: int) -> None:
        self.charged[reservation.key] += used - reservation.amount
        self.settled.set()


class Context:
    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ((ROUTE_METADATA, "chat"), (VERSION_METADATA, "v1"))


async def test_a_reservation_made_after_its_stream_ended_lets_nothing_through_and_is_released() -> None:
    # Envoy resets the stream (its message timeout, or the client gone) while the store is still
    # reserving: the answer never reaches Envoy, the request never goes upstream, and what the store
    # then reserves is given back, not charged for the window.
    policies = proc_pb2.ProcPolicySet(name="default", version="v1")
    policies.routes.add(route_id="chat", tenant_id="acme", api_id="chat", token_budget=_rule(billed=True))
    store = PolicyStore()
    store.add(compile_policy_set(policies, 4096))
    counter = HeldCounter()
    decisions = DecisionLog()
    service = ProcessingService(store, decisions, 20, 4096, Budgets(counter, degraded_s=5))  # type: ignore[arg-type]

    async def messages() -> AsyncIterator[ProcessingRequest]:
        yield ProcessingRequest(request_headers=HttpHeaders())
        yield ProcessingRequest(request_body=HttpBody(body=b'{"max_tokens": 40}', end_of_stream=True))
        await asyncio.Event().wait()  # the stream stays open until Envoy resets it

    async def run() -> None:
        async for _ in service.Process(messages(), Context()):  # type: ignore[arg-type]
            pass

    stream = asyncio.create_task(run())
    assert await asyncio.to_thread(counter.reserving.wait, 5)
    stream.cancel()
    await asyncio.sleep(0)
    counter.go.set()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(stream, 5)
    assert await asyncio.to_thread(counter.settled.wait, 5), "the late reservation stands"
    assert counter.charged == {"token_budget/acme/p/tenant": 0}
    decisions.close()
