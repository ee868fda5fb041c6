"""Sync reports of a gateway's Link: kept as history, folded into the gateway's sync state."""

from __future__ import annotations

from typing import Any

from stoa_cp.problems import Problem, not_found
from stoa_cp.store.database import Database


async def record(
    db: Database,
    gateway_id: str,
    generation: int,
    status: str,
    reason: str,
    detail: str,
    snapshot_version: str,
    settings: dict[str, Any] | None = None,
) -> None:
    """Store a report and advance the acknowledged (SYNCED) or failed generation it names; `settings`
    (what shapes the Link's translation), when the report carries them, replace the last ones."""
    last = {"generation": generation, "status": status, "reason": reason, "detail": detail}
    async with db.transaction() as conn:
        desired = await conn.fetchval(
            "SELECT generation FROM gateways WHERE gateway_id = $1 FOR UPDATE", gateway_id
        )
        if desired is None:
            raise not_found("gateway_id", gateway_id)
        if generation > desired:
            raise Problem(
                422, "Validation failed", [("generation", f"is above the desired generation {desired}")]
            )
        await conn.execute(
            "INSERT INTO sync_reports (gateway_id, generation, status, reason, detail, snapshot_version)"
            " VALUES ($1, $2, $3, $4, $5, $6)",
            gateway_id,
            generation,
            status,
            reason,
            detail,
            snapshot_version,
        )
        await conn.execute(
            """
            UPDATE gateways SET
              snapshot_version = CASE WHEN $2 AND $3 >= acknowledged_generation
                                 THEN $4 ELSE snapshot_version END,
              acknowledged_generation = CASE WHEN $2 THEN GREATEST(acknowledged_generation, $3)
                                        ELSE acknowledged_generation END,
              failed_generation = CASE WHEN NOT $2 THEN GREATEST(failed_generation, $3)
                                  ELSE failed_generation END,
              last_report = $5,
              translate_settings = coalesce($6, translate_settings)
            WHERE gateway_id = $1
            """,
            gateway_id,
            status == "SYNCED",
            generation,
            snapshot_version,
            last,
            settings,
        )


async def reported_settings(db: Database, gateway_id: str) -> dict[str, Any] | None:
    """The translation settings the gateway's Link last reported (None before any); 404 for an
    unknown gateway."""
    async with db.connection() as conn:
        row = await conn.fetchrow("SELECT translate_settings FROM gateways WHERE gateway_id = $1", gateway_id)
    if row is None:
        raise not_found("gateway_id", gateway_id)
    return row["translate_settings"]  # type: ignore[no-any-return]
