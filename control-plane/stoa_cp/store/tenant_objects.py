"""Objects a tenant (or, for gateway policies, a gateway) owns, one table each: listing, reading,
creating, replacing and deleting one, written once and parameterised by the object's `Kind`.

Every write locks its owner's row first (the lock order of `publication`) and, in the same
transaction, re-publishes what the object reaches (`Reach`): a new generation of every gateway the
owner's objects are listed on, new signed tool permissions there, or nothing (an object nothing refers
to yet, or any more). Another owner's object is as absent as none: 404 naming the id. An id unique
across tenants that another tenant holds is `Taken` (`stoa_cp.access` decides what the caller learns).
The rules of one resource (its checks on the stored state, what else a write or a deletion changes) are
hooks its own module gives.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import asyncpg
from pydantic import BaseModel

from stoa_cp.problems import Problem, Taken, conflict, not_found
from stoa_cp.settings import Settings
from stoa_cp.store import tool_permissions
from stoa_cp.store.database import Database
from stoa_cp.store.publication import bump, lock_gateway, lock_tenant, tenant_gateways

Out = TypeVar("Out", bound=BaseModel)
Values = dict[str, Any]
Connection = asyncpg.Connection


@dataclass(frozen=True)
class Owner:
    """Whose objects: the column naming the owner, its lock, and the gateways its objects reach."""

    column: str
    lock: Callable[[Connection, str], Awaitable[object]]
    gateways: Callable[[Connection, str], Awaitable[list[str]]]


async def _lock_tenant(conn: Connection, tenant_id: str) -> None:
    await lock_tenant(conn, tenant_id, "update")


async def _the_gateway(_conn: Connection, gateway_id: str) -> list[str]:
    return [gateway_id]


TENANT = Owner("tenant_id", _lock_tenant, tenant_gateways)
GATEWAY = Owner("gateway_id", lock_gateway, _the_gateway)


@dataclass(frozen=True)
class Reach:
    """What a change of the object re-publishes on the gateways its owner's objects reach."""

    generation: bool = False  # it travels in the inventory
    permissions: bool = False  # it travels in the signed tool permissions


NOTHING = Reach()
GENERATION = Reach(generation=True)
PERMISSIONS = Reach(permissions=True)


@dataclass(frozen=True)
class Kind(Generic[Out]):
    table: str
    key: str  # the id column, named by a 404 and a 409
    columns: tuple[str, ...]  # the columns of its answer beside its owner and id
    model: type[Out]
    values: Callable[[Any], Values] | None = None  # a body's columns (its fields but the id otherwise)
    owner: Owner = TENANT
    out: Callable[[asyncpg.Record], Out] | None = None  # the answer, when not the row as it is
    order: str | None = None  # of a listing (the id's order otherwise)
    reach: Reach = GENERATION
    created_reach: Reach | None = None  # None: `reach`
    deleted_reach: Reach | None = None  # None: `reach`
    # Rules on the stored state before a create or an update: values to store beside the body's.
    check: Callable[[Connection, str, Any], Awaitable[Values]] | None = None
    # After a create or an update, in its transaction: (conn, owner id, object id, body).
    written: Callable[[Connection, str, str, Any], Awaitable[None]] | None = None
    # Before a deletion, in its transaction: (conn, owner id, object id).
    deleting: Callable[[Connection, str, str], Awaitable[None]] | None = None
    # The id is unique across owners: another owner's is `Taken`, and an identical create answers the
    # stored object (`created` False) rather than a conflict.
    unique_across_tenants: bool = False
    repeatable: bool = False
    clash_field: str | None = None  # the field a 409 names for a unique constraint other than the id's
    stale_column: str | None = None  # non-null: the stored row differs from every body (set NULL on write)
    set_on_replace: str = ""  # further SET clauses of a replacement (constant text)

    @property
    def select(self) -> str:
        stale = (self.stale_column,) if self.stale_column else ()
        names = dict.fromkeys(("tenant_id", self.owner.column, self.key, *self.columns, *stale))
        return f"SELECT {', '.join(names)} FROM {self.table}"  # noqa: S608

    def values_of(self, body: Any) -> Values:
        if self.values is not None:
            return self.values(body)
        return dict(body.model_dump(exclude={self.key}))

    def answer(self, row: asyncpg.Record) -> Out:
        return self.out(row) if self.out is not None else self.model.model_validate(dict(row))


def same(stored: object, wanted: object) -> bool:
    """Equal as stored: a list and a tuple (or None and an empty list, as arrays) are the same."""
    if isinstance(stored, list | tuple) or isinstance(wanted, list | tuple):
        return list(stored or []) == list(wanted or [])  # type: ignore[call-overload]
    return stored == wanted


def _unchanged(kind: Kind[Any], row: asyncpg.Record, values: Values) -> bool:
    fresh = kind.stale_column is None or row[kind.stale_column] is None
    return fresh and all(same(row[column], value) for column, value in values.items())


async def read(
    conn: Connection, kind: Kind[Any], owner_id: str, object_id: str, *, lock: bool = False
) -> asyncpg.Record:
    """The owner's object (404 naming the id otherwise: another owner's is as unknown as none)."""
    suffix = " FOR UPDATE" if lock else ""
    row = await conn.fetchrow(
        f"{kind.select} WHERE {kind.owner.column} = $1 AND {kind.key} = $2{suffix}", owner_id, object_id
    )
    if row is None:
        raise not_found(kind.key, object_id)
    return row


async def publish(
    conn: Connection, kind: Kind[Any], owner_id: str, reach: Reach, signer: tool_permissions.Signer | None
) -> None:
    if not (reach.generation or reach.permissions):
        return
    gateways = await kind.owner.gateways(conn, owner_id)
    if reach.generation:
        await bump(conn, gateways)
    if reach.permissions:
        await tool_permissions.resign(conn, gateways, signer)


async def _taken(conn: Connection, kind: Kind[Any], object_id: str) -> Problem:
    holder = await conn.fetchval(f"SELECT tenant_id FROM {kind.table} WHERE {kind.key} = $1", object_id)  # noqa: S608
    # Deleted since the clash: nobody's object to hide, a plain conflict (trying again may succeed).
    return conflict(kind.key, object_id) if holder is None else Taken(kind.key, object_id, holder)


async def _insert(conn: Connection, kind: Kind[Any], owner_id: str, object_id: str, values: Values) -> None:
    names = (kind.owner.column, kind.key, *values)
    places = ", ".join(f"${i}" for i in range(1, len(names) + 1))
    try:
        # A savepoint: after a clash the transaction still reads whose object holds the id.
        async with conn.transaction():
            await conn.execute(
                f"INSERT INTO {kind.table} ({', '.join(names)}) VALUES ({places})",  # noqa: S608
                owner_id,
                object_id,
                *values.values(),
            )
    except asyncpg.UniqueViolationError as exc:
        if kind.clash_field is not None and exc.constraint_name != f"{kind.table}_pkey":
            raise conflict(kind.clash_field, values[kind.clash_field]) from None
        if kind.unique_across_tenants:
            raise await _taken(conn, kind, object_id) from None
        raise conflict(kind.key, object_id) from None


async def _checked(conn: Connection, kind: Kind[Any], owner_id: str, body: Any) -> Values:
    """The body's columns, after the kind's rules on the stored state (with the values they add)."""
    values = kind.values_of(body)
    if kind.check is not None:
        values.update(await kind.check(conn, owner_id, body))
    return values


async def _replayed(
    conn: Connection, kind: Kind[Out], owner_id: str, object_id: str, values: Values
) -> Out | None:
    """The stored object when a repeated create asks for it exactly; Taken when another holds the id."""
    row = await conn.fetchrow(f"{kind.select} WHERE {kind.key} = $1", object_id)
    if row is None:
        return None
    if row[kind.owner.column] == owner_id and _unchanged(kind, row, values):
        return kind.answer(row)
    raise Taken(kind.key, object_id, row["tenant_id"])


async def _written(
    conn: Connection,
    kind: Kind[Out],
    owner_id: str,
    object_id: str,
    body: Any,
    reach: Reach | None,
    signer: tool_permissions.Signer | None,
) -> Out:
    """After an insert or a replacement: the kind's own writes, what it re-publishes (`reach`, the
    kind's when None), and the object as stored."""
    if kind.written is not None:
        await kind.written(conn, owner_id, object_id, body)
    await publish(conn, kind, owner_id, reach or kind.reach, signer)
    return kind.answer(await read(conn, kind, owner_id, object_id))


@contextlib.asynccontextmanager
async def _held(
    db: Database, kind: Kind[Any], owner_id: str, object_id: str
) -> AsyncIterator[tuple[Connection, asyncpg.Record]]:
    """A transaction holding the owner's lock, then the object's row as it stands (404 if none)."""
    async with db.transaction() as conn:
        await kind.owner.lock(conn, owner_id)
        yield conn, await read(conn, kind, owner_id, object_id, lock=True)


@dataclass(frozen=True)
class Services:
    """What a write may need beyond the database: the settings, and the signer of tool permissions."""

    settings: Settings
    signer: tool_permissions.Signer | None


class Objects(Generic[Out]):
    """The operations the routers call (`routers.tenant_objects`) on the objects of one kind.
    `prepare(body, object_id, services)`: the body as stored (a normal form), when not as given."""

    def __init__(self, kind: Kind[Out], prepare: Callable[[Any, str, Services], Any] | None = None) -> None:
        self.kind = kind
        self.prepare = prepare

    @property
    def key(self) -> str:
        return self.kind.key

    @property
    def model(self) -> type[Out]:
        return self.kind.model

    @property
    def repeatable(self) -> bool:
        return self.kind.repeatable

    def _prepared(self, body: Any, object_id: str, services: Services) -> Any:
        return body if self.prepare is None else self.prepare(body, object_id, services)

    async def create(self, db: Database, services: Services, owner_id: str, body: Any) -> tuple[Out, bool]:
        """The object, and whether this call created it (False: a repeatable create found it as asked)."""
        kind = self.kind
        object_id = getattr(body, kind.key)
        stored = self._prepared(body, object_id, services)
        async with db.transaction() as conn:
            await kind.owner.lock(conn, owner_id)
            values = await _checked(conn, kind, owner_id, stored)
            if kind.repeatable:
                replayed = await _replayed(conn, kind, owner_id, object_id, values)
                if replayed is not None:
                    return replayed, False
            await _insert(conn, kind, owner_id, object_id, values)
            written = await _written(
                conn, kind, owner_id, object_id, stored, kind.created_reach, services.signer
            )
            return written, True

    async def list_for(self, db: Database, owner_id: str) -> list[Out]:
        kind = self.kind
        async with db.connection() as conn:
            rows = await conn.fetch(
                f"{kind.select} WHERE {kind.owner.column} = $1 ORDER BY {kind.order or kind.key}", owner_id
            )
        return [kind.answer(row) for row in rows]

    async def get(self, db: Database, owner_id: str, object_id: str) -> Out:
        async with db.connection() as conn:
            return self.kind.answer(await read(conn, self.kind, owner_id, object_id))

    async def update(self, db: Database, services: Services, owner_id: str, object_id: str, body: Any) -> Out:
        """Replace the object's fields; an unchanged body changes nothing (nothing re-published)."""
        kind = self.kind
        stored = self._prepared(body, object_id, services)
        async with _held(db, kind, owner_id, object_id) as (conn, current):
            values = await _checked(conn, kind, owner_id, stored)
            if _unchanged(kind, current, values):
                return kind.answer(current)
            sets = [f"{column} = ${i}" for i, column in enumerate(values, start=3)]
            if kind.stale_column:
                sets.append(f"{kind.stale_column} = NULL")
            if kind.set_on_replace:
                sets.append(kind.set_on_replace)
            await conn.execute(
                f"UPDATE {kind.table} SET {', '.join(sets)}"  # noqa: S608
                f" WHERE {kind.owner.column} = $1 AND {kind.key} = $2",
                owner_id,
                object_id,
                *values.values(),
            )
            return await _written(conn, kind, owner_id, object_id, stored, kind.reach, services.signer)

    async def delete(self, db: Database, services: Services, owner_id: str, object_id: str) -> None:
        kind = self.kind
        async with _held(db, kind, owner_id, object_id) as (conn, _):
            if kind.deleting is not None:
                await kind.deleting(conn, owner_id, object_id)
            await conn.execute(
                f"DELETE FROM {kind.table} WHERE {kind.owner.column} = $1 AND {kind.key} = $2",  # noqa: S608
                owner_id,
                object_id,
            )
            await publish(conn, kind, owner_id, kind.deleted_reach or kind.reach, services.signer)
