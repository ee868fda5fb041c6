"""The audit log's records (what goes in them: `stoa_cp.audit`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from stoa_cp.audit import Draft
from stoa_cp.principal import Principal
from stoa_cp.store.database import Database


async def record(db: Database, who: Principal, method: str, path: str, status: int, draft: Draft) -> None:
    async with db.connection() as conn:
        await conn.execute(
            "INSERT INTO audit_log (subject, role, actor_tenant, issuer, method, path, status, tenant_id,"
            " object_ids, generations) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
            who.subject,
            str(who.role),
            who.tenant,
            who.issuer,
            method,
            path,
            status,
            # An attempt on an object the caller may not address is filed under the caller's own tenant.
            draft.tenant_id or who.tenant,
            draft.object_ids,
            draft.generations,
        )


async def entries(
    db: Database, tenant_id: str | None, since: datetime | None, until: datetime | None, limit: int
) -> list[dict[str, Any]]:
    """Newest first. A tenant's entries are the writes to its objects and the writes of its people."""
    async with db.connection() as conn:
        rows = await conn.fetch(
            "SELECT id, at, subject, role, actor_tenant, issuer, method, path, status, tenant_id, object_ids,"
            " generations FROM audit_log"
            " WHERE ($1::text IS NULL OR tenant_id = $1 OR actor_tenant = $1)"
            " AND ($2::timestamptz IS NULL OR at >= $2) AND ($3::timestamptz IS NULL OR at < $3)"
            " ORDER BY id DESC LIMIT $4",
            tenant_id,
            since,
            until,
            limit,
        )
    return [dict(row) for row in rows]
