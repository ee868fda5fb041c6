"""The quota library on a real PostgreSQL: billed counts are exact under a burst and fail closed;
batched counts are shared through PostgreSQL and degrade within their bounds; token reservations never
commit more than the limit under a burst and settle in their reservation's window; the response
fields."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from stoa_harness.ports import free_port
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import wait_until
from stoa_quota import (
    BatchedCounter,
    BilledCounter,
    DegradedMode,
    Outcome,
    QuotaStore,
    QuotaUnavailable,
    TokenCounter,
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


@pytest.fixture
def clock() -> Clock:
    return Clock(1_000_000.0)


@pytest.fixture
def clocked(dsn: str, clock: Clock) -> Iterator[QuotaStore]:
    opened = QuotaStore(dsn, max_size=10, clock=clock).open()
    yield opened
    opened.close()


def test_a_parallel_burst_reserves_at_most_the_limit(clocked: QuotaStore) -> None:
    counter = TokenCounter(clocked)
    key = uuid.uuid4().hex
    with ThreadPoolExecutor(max_workers=50) as pool:
        reservations = list(pool.map(lambda _: counter.reserve(key, 30, 1000, 60), range(100)))
    allowed = [r for r in reservations if r.allowed]
    assert len(allowed) == 33  # 33 * 30 = 990; a 34th would pass 1000
    assert counter.used(key, 60) == 990
    refused = next(r for r in reservations if not r.allowed)
    assert refused.outcome.reset_s == 20  # 1,000,000 s is 40 s into a window of 60 s


def test_settlement_charges_what_was_used(clocked: QuotaStore, clock: Clock) -> None:
    counter = TokenCounter(clocked)
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


def test_an_amount_above_the_limit_never_fits(clocked: QuotaStore) -> None:
    counter = TokenCounter(clocked)
    key = uuid.uuid4().hex
    assert not counter.reserve(key, 11, 10, 60).allowed
    assert counter.used(key, 60) == 0


def test_tokens_of_an_unreachable_store_are_quota_unavailable() -> None:
    store = unreachable(Clock(1_000_000.0))
    try:
        with pytest.raises(QuotaUnavailable):
            TokenCounter(store).reserve("k", 1, 10, 60)
    finally:
        store.close()


@pytest.fixture(scope="module")
def faulty() -> Iterator[EmbeddedPostgres]:
    """A server of its own, for the tests that stop or freeze it."""
    with EmbeddedPostgres() as server:
        yield server


def test_a_server_that_stops_answering_is_unavailable_not_a_stuck_caller(faulty: EmbeddedPostgres) -> None:
    store = QuotaStore(faulty.dsn, timeout_s=0.3).open()
    counter = BilledCounter(store)
    outcomes: list[object] = []

    def take() -> None:
        try:
            outcomes.append(counter.take("frozen", 10, 60))
        except QuotaUnavailable as exc:
            outcomes.append(exc)

    try:
        assert counter.take("frozen", 10, 60).allowed
        # Stopped processes keep their sockets: the kernel takes the statement, nothing answers, and
        # the server's own statement timeout never runs.
        with faulty.frozen():
            caller = threading.Thread(target=take, daemon=True)
            caller.start()
            caller.join(5)
            assert not caller.is_alive(), "the count waited on a server that does not answer"
        assert len(outcomes) == 1
        assert isinstance(outcomes[0], QuotaUnavailable)
        wait_until(lambda: counter.take("frozen", 10, 60).allowed, 5, "counting again after the thaw")
    finally:
        store.close()


def refused_within(counter: BilledCounter, key: str, limit: int, window_s: int, bound_s: float) -> bool:
    """Whether a count of `key`, made on a thread of its own, is refused (QuotaUnavailable) within
    `bound_s` (the thread is left to finish its wait on its own)."""
    refused = threading.Event()

    def take() -> None:
        with contextlib.suppress(QuotaUnavailable):
            counter.take(key, limit, window_s)
            return
        refused.set()

    threading.Thread(target=take, daemon=True).start()
    return refused.wait(bound_s)


def test_once_a_server_stopped_answering_the_next_count_is_refused_without_the_whole_wait(
    faulty: EmbeddedPostgres,
) -> None:
    """A caller that met a server not answering leaves it known lost: the next caller is refused at
    once rather than held its whole timeout for a connection (past the deadline of whoever waits on
    it: Envoy waits 250 ms for a Check)."""
    store = QuotaStore(faulty.dsn, max_size=1, timeout_s=1.0).open()
    counter = BilledCounter(store)
    try:
        assert counter.take("frozen-next", 10, 60).allowed
        with faulty.frozen():
            with pytest.raises(QuotaUnavailable):
                counter.take("frozen-next", 10, 60)
            next_refused = refused_within(counter, "frozen-next", 10, 60, 0.5)
        assert next_refused, "the next count waited the whole timeout on a server known lost"
        wait_until(lambda: counter.take("frozen-next", 10, 60).allowed, 5, "counting again after the thaw")
    finally:
        store.close()


def test_counting_resumes_soon_after_the_server_is_back(faulty: EmbeddedPostgres) -> None:
    store = QuotaStore(faulty.dsn, timeout_s=0.2).open()
    counter = BilledCounter(store)
    try:
        assert counter.take("outage", 1000, 3600).allowed
        faulty.stop_server()
        try:
            # Callers keep coming while it is down: every connection is found broken and remade in vain.
            down = time.monotonic()
            while time.monotonic() - down < 8:
                with pytest.raises(QuotaUnavailable):
                    counter.take("outage", 1000, 3600)
                time.sleep(0.1)
        finally:
            faulty.resume()
        # Not after the pool's doubling delays between attempts (by then up to as long as the outage).
        wait_until(lambda: counter.take("outage", 1000, 3600).allowed, 2.5, "counting again")
    finally:
        store.close()


def test_after_a_restart_one_count_finds_the_pool_lost_not_one_per_connection(
    faulty: EmbeddedPostgres,
) -> None:
    store = QuotaStore(faulty.dsn, max_size=4, timeout_s=0.3).open()
    counter = BilledCounter(store)

    def take() -> bool:
        try:
            return counter.take("restart", 1000, 3600).allowed
        except QuotaUnavailable:
            return False

    try:
        wait_until(lambda: store.pool.get_stats()["pool_available"] == 4, 5, "every connection open")
        faulty.stop_server()
        faulty.resume()
        # The first count learns the connections are gone; the others are tested, not each failed.
        outcomes = [take()]
        wait_until(lambda: store.pool.get_stats()["pool_available"] >= 3, 2, "the pool's connections back")
        outcomes += [take() for _ in range(3)]
        assert outcomes[1:] == [True, True, True], outcomes
    finally:
        store.close()


def test_while_the_server_is_known_lost_a_count_is_refused_without_the_whole_wait(
    faulty: EmbeddedPostgres,
) -> None:
    # A long timeout: a caller held for it would be past the deadline of whoever waits on it (Envoy
    # waits 250 ms for a Check), and would hold its thread meanwhile.
    store = QuotaStore(faulty.dsn, max_size=2, timeout_s=3.0).open()
    counter = BilledCounter(store)
    try:
        assert counter.take("lost", 1000, 3600).allowed
        faulty.stop_server()
        try:
            for _ in range(2):  # every connection the pool held found lost
                with pytest.raises(QuotaUnavailable):
                    counter.take("lost", 1000, 3600)
            assert refused_within(counter, "lost", 1000, 3600, 1.0), (
                "a count waited the whole timeout on a server known lost"
            )
        finally:
            faulty.resume()
        wait_until(lambda: counter.take("lost", 1000, 3600).allowed, 3, "counting again")
    finally:
        store.close()


def test_a_server_down_from_the_start_is_refused_without_the_whole_wait_once_known() -> None:
    store = QuotaStore(f"postgresql://stoa@127.0.0.1:{free_port()}/none", timeout_s=1.5).open(None)
    counter = BilledCounter(store)
    try:
        with pytest.raises(QuotaUnavailable):
            counter.take("never", 10, 60)  # the whole wait: the pool is still trying to connect
        assert refused_within(counter, "never", 10, 60, 0.75), (
            "a count waited the whole timeout on a server known unreachable"
        )
    finally:
        store.close()
