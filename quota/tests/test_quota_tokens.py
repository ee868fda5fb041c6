"""Token reservations on a real PostgreSQL: a parallel burst never commits more than the limit,
settlement corrects the count in the reservation's window, an unreachable store is QuotaUnavailable."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from stoa_harness.ports import free_port
from stoa_harness.postgres import EmbeddedPostgres
from stoa_quota import QuotaStore, QuotaUnavailable, TokenCounter


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def dsn() -> Iterator[str]:
    with EmbeddedPostgres() as server:
        yield server.create_database(f"tokens_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def clock() -> Clock:
    return Clock(1_000_000.0)


@pytest.fixture
def store(dsn: str, clock: Clock) -> Iterator[QuotaStore]:
    opened = QuotaStore(dsn, max_size=10, clock=clock).open()
    yield opened
    opened.close()


def test_a_parallel_burst_reserves_at_most_the_limit(store: QuotaStore) -> None:
    counter = TokenCounter(store)
    key = uuid.uuid4().hex
    with ThreadPoolExecutor(max_workers=50) as pool:
        reservations = list(pool.map(lambda _: counter.reserve(key, 30, 1000, 60), range(100)))
    allowed = [r for r in reservations if r.allowed]
    assert len(allowed) == 33  # 33 * 30 = 990; a 34th would pass 1000
    assert counter.used(key, 60) == 990
    refused = next(r for r in reservations if not r.allowed)
    assert refused.outcome.reset_s == 20  # 1,000,000 s is 40 s into a window of 60 s


def test_settlement_charges_what_was_used(store: QuotaStore, clock: Clock) -> None:
    counter = TokenCounter(store)
    key = uuid.uuid4().hex
    a = counter.reserve(key, 100, 250, 60)
    b = counter.reserve(key, 100, 250, 60)
    assert (a.allowed, b.allowed, a.outcome.remaining, b.outcome.remaining) == (True, True, 150, 50)
    assert not counter.reserve(key, 100, 250, 60).allowed
    counter.settle(a, 20)  # less than reserved: room for another reservation
    assert counter.used(key, 60) == 120
    c = counter.reserve(key, 100, 250, 60)
    assert c.allowed
    counter.settle(c, 180)  # more than reserved: charged, over the limit by what was not reserved
    assert counter.used(key, 60) == 300
    # A settlement lands in its reservation's window, even after that window ended.
    clock.now += 60
    counter.settle(b, 0)
    assert counter.used(key, 60) == 0
    clock.now -= 60
    assert counter.used(key, 60) == 200


def test_an_amount_above_the_limit_never_fits(store: QuotaStore) -> None:
    counter = TokenCounter(store)
    key = uuid.uuid4().hex
    assert not counter.reserve(key, 11, 10, 60).allowed
    assert counter.used(key, 60) == 0


def test_unreachable_store_is_quota_unavailable(clock: Clock) -> None:
    store = QuotaStore(f"postgresql://stoa@127.0.0.1:{free_port()}/none", timeout_s=0.2, clock=clock).open(
        None
    )
    try:
        with pytest.raises(QuotaUnavailable):
            TokenCounter(store).reserve("k", 1, 10, 60)
    finally:
        store.close()
