"""The database: connection pool, versioned migrations applied at start, and the two ways the stores
use a connection (a read, a transaction), each bounded in time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Literal

import asyncpg

from stoa_cp import request_body
from stoa_cp.problems import Problem

log = logging.getLogger("stoa_cp")

# Any constant works; it only has to be the same in every CP process sharing the database.
_MIGRATION_LOCK = 0x5704_C0DE


def migration_files() -> list[tuple[str, str]]:
    """(version, sql) sorted by version; the version is the file name without `.sql`."""
    folder = resources.files("stoa_cp") / "migrations"
    files = sorted(
        (entry.name.removesuffix(".sql"), entry.read_text())
        for entry in folder.iterdir()
        if entry.name.endswith(".sql")
    )
    return files


async def migrate(conn: asyncpg.Connection) -> list[str]:
    """Apply pending migrations in one transaction, serialised across processes by an advisory lock."""
    applied_now: list[str] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _MIGRATION_LOCK)
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations ("
            " version text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
        )
        done = {row["version"] for row in await conn.fetch("SELECT version FROM schema_migrations")}
        for version, sql in migration_files():
            if version in done:
                continue
            await conn.execute(sql)
            await conn.execute("INSERT INTO schema_migrations (version) VALUES ($1)", version)
            applied_now.append(version)
    if applied_now:
        log.info("applied migrations %s", ", ".join(applied_now))
    return applied_now


async def _init_connection(conn: asyncpg.Connection) -> None:
    # jsonb columns come back as Python objects and go in from them.
    await conn.set_type_codec("jsonb", encoder=json.dumps, decoder=json.loads, schema="pg_catalog")


Isolation = Literal["read_committed", "repeatable_read", "serializable"]

# Every way the database can fail to answer in time or at all: the caller gets 503, never a hang or a 500.
UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,  # refused or reset (a stopped server); TimeoutError too: a bound passed on this side
    asyncpg.InterfaceError,  # the connection is closed or unusable
    asyncpg.PostgresConnectionError,  # class 08
    asyncpg.InsufficientResourcesError,  # class 53: too many connections
    asyncpg.exceptions.OperatorInterventionError,  # class 57: shutdown, starting up, statement_timeout
    asyncpg.LockNotAvailableError,  # lock_timeout
    asyncpg.IdleInTransactionSessionTimeoutError,
    asyncpg.exceptions.TransactionTimeoutError,  # transaction_timeout
)


@dataclass(frozen=True)
class Bounds:
    """How long each database wait may take (seconds), and the Retry-After of a 503."""

    connect_s: float = 5.0
    acquire_s: float = 5.0
    statement_s: float = 10.0
    transaction_s: float = 30.0
    retry_after_s: int = 5


class DatabaseUnavailable(Problem):
    """503 raised before any COMMIT was sent: nothing the request asked for was stored."""

    def __init__(self, bounds: Bounds, what: str) -> None:
        super().__init__(
            503,
            "Database unavailable",
            [("database", f"{what}; nothing was stored, retry later")],
            headers={"Retry-After": str(bounds.retry_after_s)},
        )


class ClientGone(Problem):
    """The client closed its connection before the COMMIT: rolled back, and nobody reads this answer."""

    def __init__(self) -> None:
        super().__init__(503, "Client gone", [("client", "closed the connection; nothing was stored")])


class CommitOutcomeUnknown(Problem):
    """503 after the COMMIT was sent and not confirmed within the statement bound."""

    def __init__(self, bounds: Bounds) -> None:
        super().__init__(
            503,
            "Commit outcome unknown",
            [
                (
                    "database",
                    "the commit was sent but not confirmed in time: the change may be stored; repeat the "
                    "same request once the database answers (a create with the same body answers with "
                    "the stored resource)",
                )
            ],
            headers={"Retry-After": str(bounds.retry_after_s)},
        )


def _describe(exc: BaseException, waiting_for: str) -> str:
    if isinstance(exc, TimeoutError):
        return f"no answer to {waiting_for} within its bound"
    return f"{waiting_for} failed ({type(exc).__name__})"


class Database:
    """The pool, and the only ways the stores take a connection from it. Every wait is bounded: a
    connection within `acquire_s` (a new one within `connect_s`), each statement within `statement_s`
    (on this side, and by the server's `statement_timeout` and `lock_timeout`), each transaction
    within `transaction_s` (the server's `transaction_timeout`). Past a bound the connection is closed
    (so a frozen server can never commit what it was sent) and the request gets a 503."""

    def __init__(self, pool: asyncpg.Pool, bounds: Bounds) -> None:
        self.pool = pool
        self.bounds = bounds

    @classmethod
    async def open(cls, dsn: str, min_size: int, max_size: int, bounds: Bounds) -> Database:
        statement_ms = str(int(bounds.statement_s * 1000))
        transaction_ms = str(int(bounds.transaction_s * 1000))
        pool = await asyncpg.create_pool(
            dsn,
            min_size=min_size,
            max_size=max_size,
            init=_init_connection,
            timeout=bounds.connect_s,
            command_timeout=bounds.statement_s,
            server_settings={
                "statement_timeout": statement_ms,
                "lock_timeout": statement_ms,
                "transaction_timeout": transaction_ms,
                "idle_in_transaction_session_timeout": transaction_ms,
            },
        )
        async with pool.acquire() as conn:
            await migrate(conn)
        return cls(pool, bounds)

    async def close(self) -> None:
        await self.pool.close()

    async def ping(self, timeout_s: float) -> None:
        """One round trip within `timeout_s`, taking a connection included."""
        deadline = time.monotonic() + timeout_s
        conn = await self._acquire(timeout_s)
        try:
            await conn.fetchval("SELECT 1", timeout=max(deadline - time.monotonic(), 0.001))
        except BaseException as exc:
            self._discard_if_broken(conn, exc)
            raise
        finally:
            await self._release(conn)

    async def _acquire(self, timeout_s: float | None = None) -> asyncpg.Connection:
        try:
            return await self.pool.acquire(timeout=timeout_s or self.bounds.acquire_s)
        except UNAVAILABLE as exc:
            raise DatabaseUnavailable(self.bounds, _describe(exc, "a connection")) from exc

    async def _release(self, conn: asyncpg.Connection) -> None:
        # The pool closes a connection it cannot reset in time; that is all that is wanted here.
        with contextlib.suppress(*UNAVAILABLE):
            await self.pool.release(conn, timeout=self.bounds.statement_s)

    @staticmethod
    def _discard_if_broken(conn: asyncpg.Connection, exc: BaseException) -> bool:
        """Close the connection when `exc` leaves it in an unknown state (a bound passed mid-statement,
        the task cancelled): closing is the one thing that cannot wait on the server."""
        if isinstance(exc, (*UNAVAILABLE, asyncio.CancelledError)):
            conn.terminate()
            return True
        return False

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection for reads outside a transaction."""
        conn = await self._acquire()
        try:
            yield conn
        except UNAVAILABLE as exc:
            self._discard_if_broken(conn, exc)
            raise DatabaseUnavailable(self.bounds, _describe(exc, "a read")) from exc
        except asyncio.CancelledError as exc:
            self._discard_if_broken(conn, exc)
            raise
        finally:
            await self._release(conn)

    @asynccontextmanager
    async def transaction(
        self, isolation: Isolation = "read_committed", readonly: bool = False
    ) -> AsyncIterator[asyncpg.Connection]:
        """A connection inside a transaction, committed when the block ends without an exception and
        the request's client still waits for the answer. Every error answered from here on was raised
        before the COMMIT was sent, except CommitOutcomeUnknown."""
        conn = await self._acquire()
        # Closed once at most: a closed connection goes back to the pool at once, and its proxy then
        # refuses every call (a second close would turn the 503 into an InterfaceError).
        discarded = False
        try:
            tx = conn.transaction(isolation=isolation, readonly=readonly)
            try:
                await tx.start()
                try:
                    yield conn
                except BaseException as exc:
                    discarded = self._discard_if_broken(conn, exc)
                    if not discarded:
                        await tx.rollback()
                    raise
                if not readonly and await request_body.client_gone():
                    await tx.rollback()
                    log.info("client gone before the commit: rolled back")
                    raise ClientGone()
            except UNAVAILABLE as exc:
                if not discarded:
                    self._discard_if_broken(conn, exc)
                raise DatabaseUnavailable(self.bounds, _describe(exc, "a statement")) from exc
            try:
                await tx.commit()
            except UNAVAILABLE as exc:
                self._discard_if_broken(conn, exc)
                log.error("commit outcome unknown: %s", exc)
                raise CommitOutcomeUnknown(self.bounds) from exc
        finally:
            await self._release(conn)
