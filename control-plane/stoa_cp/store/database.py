"""The database: connection pool, versioned migrations applied at start, and the two ways the stores
use a connection (a read, a transaction)."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Literal

import asyncpg

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


class Database:
    """The pool, and the only ways the stores take a connection from it."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @classmethod
    async def open(cls, dsn: str, min_size: int, max_size: int) -> Database:
        pool = await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size, init=_init_connection)
        async with pool.acquire() as conn:
            await migrate(conn)
        return cls(pool)

    async def close(self) -> None:
        await self.pool.close()

    async def ping(self) -> None:
        async with self.connection() as conn:
            await conn.fetchval("SELECT 1")

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """A connection for reads outside a transaction."""
        async with self.pool.acquire() as conn:
            yield conn

    @asynccontextmanager
    async def transaction(
        self, isolation: Isolation = "read_committed", readonly: bool = False
    ) -> AsyncIterator[asyncpg.Connection]:
        """A connection inside a transaction, committed when the block ends without an exception."""
        async with self.pool.acquire() as conn, conn.transaction(isolation=isolation, readonly=readonly):
            yield conn
