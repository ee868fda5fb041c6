"""The quota library on a real PostgreSQL: billed counts are exact under a burst and fail closed;
batched counts are shared through PostgreSQL and degrade within their bounds; the response fields."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from stoa_harness.ports import free_port
from stoa_harness.postgres import EmbeddedPostgres
from stoa_quota import (
    BatchedCounter,
    BilledCounter,
    DegradedMode,
    Outcome,
    QuotaStore,
    QuotaUnavailable,
    Window,
    rate_limit_fields,
)


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    with EmbeddedPostgres() as server:
        yield server.create_database(f"quota_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def store(dsn: str) -> Iterator[QuotaStore]:
    opened = QuotaStore(dsn, max_size=10).open()
    yield opened
    opened.close()


def unreachable(clock: Clock) -> QuotaStore:
    """A store whose PostgreSQL does not answer (nothing listens on its port)."""
    return QuotaStore(f"postgresql://stoa@127.0.0.1:{free_port()}/none", timeout_s=0.2, clock=clock).open(
        None
    )


def test_billed_is_exact_under_a_concurrent_burst(store: QuotaStore) -> None:
    counter = BilledCounter(store)
    key = uuid.uuid4().hex
    with ThreadPoolExecutor(max_workers=100) as pool:
        outcomes = list(pool.map(lambda _: counter.take(key, 10, 300), range(100)))
    allowed = [o for o in outcomes if o.allowed]
    assert len(allowed) == 10
    assert sorted(o.remaining for o in allowed) == list(range(10))
    assert all(o.remaining == 0 for o in outcomes if not o.allowed)


def test_billed_fails_closed_when_postgres_is_unreachable() -> None:
    store = unreachable(Clock(1_000.0))
    try:
        with pytest.raises(QuotaUnavailable):
            BilledCounter(store).take("k", 10, 60)
    finally:
        store.close()


def test_denial_resets_with_its_window(dsn: str) -> None:
    clock = Clock(1_000_000.0)  # 1,000,000 = 3,333 windows of 300 s + 100 s
    store = QuotaStore(dsn, clock=clock).open()
    try:
        counter = BilledCounter(store)
        key = uuid.uuid4().hex
        assert counter.take(key, 1, 300).allowed
        denied = counter.take(key, 1, 300)
        assert (denied.allowed, denied.reset_s) == (False, 200)
        assert rate_limit_fields("gold", denied) == [
            ("ratelimit-policy", '"gold";q=1;w=300'),
            ("ratelimit", '"gold";r=0;t=200'),
        ]
        clock.now += 200
        assert counter.take(key, 1, 300).allowed
    finally:
        store.close()


def test_batched_counts_are_shared_through_postgres(store: QuotaStore) -> None:
    first, second = BatchedCounter(store), BatchedCounter(store)
    key = uuid.uuid4().hex
    assert all(first.take(key, 10, 300).allowed for _ in range(6))
    first.flush()
    # A counter learns the shared count at its first flush (until then it counts what it admits).
    assert second.take(key, 10, 300).allowed
    second.flush()
    admitted = [second.take(key, 10, 300).allowed for _ in range(5)]
    assert admitted == [True] * 3 + [False] * 2
    second.flush()
    first.flush()
    assert not first.take(key, 10, 300).allowed


def test_batched_degrades_within_overshoot_and_time_then_denies(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock(2_000.0)
    store = unreachable(clock)
    counter = BatchedCounter(store, degraded=DegradedMode(overshoot=3, max_s=5.0))
    try:
        assert counter.take("k", 100, 60).allowed  # before any flush has failed
        counter.flush()  # fails: degraded from now on
        assert [counter.take("k", 100, 60).allowed for _ in range(3)] == [True] * 3
        with pytest.raises(QuotaUnavailable):
            counter.take("k", 100, 60)
        assert counter.take("other", 100, 60).allowed
        clock.now += 5.1
        with pytest.raises(QuotaUnavailable):
            counter.take("third", 100, 60)
        # The flusher says once that the time is up (what an operator, or a test, waits on).
        for _ in range(2):
            counter.flush()
        expired = [r for r in caplog.records if r.getMessage() == "quota degraded mode expired: denying"]
        assert len(expired) == 1
    finally:
        store.close()


def test_window_and_outcome() -> None:
    window = Window.at(60, 125.5)
    assert (window.number, window.reset_s) == (2, 54.5)
    assert Outcome(True, 5, 4, window).reset_s == 55
