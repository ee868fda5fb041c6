"""Gateway-facing endpoints (the Link): config, SSE events, sync reports. Only the gateway's own
credential is accepted (401 none/unknown, 403 another gateway's)."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import APIRouter, Body, Header, Query, Request, Response
from google.protobuf import json_format
from sse_starlette import EventSourceResponse, ServerSentEvent
from stoa_proto import inventory_pb2

from stoa_cp.auth import GatewayCredential
from stoa_cp.dependencies import Db
from stoa_cp.problems import PROBLEM_RESPONSES, invalid, not_found
from stoa_cp.schemas import GatewayStatus, unstorable
from stoa_cp.store import gateways, sync_reports, tool_permissions
from stoa_cp.store.changes import DeltaTracker
from stoa_cp.store.inventory import InventoryCache

log = logging.getLogger("stoa_cp.link")
router = APIRouter(prefix="/v1/gateways/{gateway_id}", tags=["gateway link"], responses=PROBLEM_RESPONSES)

_INVENTORY_DOC = {
    200: {
        "description": "The gateway's complete inventory (stoa.inventory.v1.Inventory as proto3 JSON)",
        "content": {"application/json": {}},
    }
}


def _cache(request: Request) -> InventoryCache:
    return request.app.state.inventory_cache  # type: ignore[no-any-return]


@router.get("/config", response_class=Response, responses=_INVENTORY_DOC)
async def get_config(gateway_id: GatewayCredential, request: Request, db: Db) -> Response:
    current = await _cache(request).current(db, gateway_id)
    if current is None:
        raise not_found("gateway_id", gateway_id)
    return Response(content=current[1], media_type="application/json")


@router.get(
    "/events",
    response_class=EventSourceResponse,
    responses={
        200: {
            "description": "SSE, id = generation. Event `inventory`: data = the complete Inventory (JSON). "
            "With ?deltas=true, event `delta`: data = an InventoryDelta from the previous event's generation "
            "(the complete inventory only when the CP does not hold the deltas from Last-Event-ID).",
            "content": {"text/event-stream": {}},
        }
    },
)
async def stream_events(
    gateway_id: GatewayCredential,
    request: Request,
    db: Db,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
    deltas: Annotated[
        bool, Query(description="send what changed (InventoryDelta) instead of everything")
    ] = False,
) -> EventSourceResponse:
    """Every generation above the last one sent (or Last-Event-ID): the complete inventory, or with
    `deltas` what changed since the previous one; and the gateway's signed tool permissions, at
    connection and whenever they are signed again, as `tool-permissions` events without an id (they
    are not generations: Last-Event-ID stays one)."""
    try:
        last_sent = int(last_event_id) if last_event_id not in (None, "") else 0
    except ValueError:
        raise invalid("Last-Event-ID", "must be a generation (an integer)") from None
    if last_sent > 0:
        await gateways.move_above(db, gateway_id, last_sent, "Last-Event-ID")
    cache = _cache(request)
    tracker: DeltaTracker = request.app.state.delta_tracker
    events = request.app.state.events

    async def complete() -> tuple[int, ServerSentEvent] | None:
        current = await cache.current(db, gateway_id)
        if current is None:
            return None
        return current[0], ServerSentEvent(data=current[1], event="inventory", id=str(current[0]))

    async def changed() -> list[tuple[int, ServerSentEvent]] | None:
        found = await tracker.since(db, gateway_id, last_sent)
        if found is None:
            return None
        if found[1] is None:  # the deltas from last_sent are not held here
            one = await complete()
            return None if one is None else [one]
        return [
            (e.generation, ServerSentEvent(data=e.data, event="delta", id=str(e.generation)))
            for e in found[1]
        ]

    async def stream() -> AsyncIterator[ServerSentEvent]:
        nonlocal last_sent
        permissions_sent = 0
        with events.subscribe(gateway_id) as wake:
            woken = time.perf_counter()
            while True:
                # Clear before reading: a change committed during the read wakes the next round.
                wake.clear()
                if deltas:
                    pending = await changed()
                else:
                    one = await complete()
                    pending = None if one is None else [one]
                if pending is None:
                    return
                for generation, event in pending:
                    if generation <= last_sent:
                        continue
                    # Resumes once the event was handed to the response (after its socket write).
                    ready = time.perf_counter()
                    yield event
                    log.info(
                        "inventory_sent gateway=%s generation=%d event=%s bytes=%d read_ms=%.1f"
                        " write_ms=%.1f",
                        gateway_id,
                        generation,
                        event.event,
                        len(event.data),
                        (ready - woken) * 1000,
                        (time.perf_counter() - ready) * 1000,
                    )
                    last_sent = generation
                async with db.connection() as conn:
                    permissions = await tool_permissions.current(conn, gateway_id)
                if permissions is not None and permissions.seq > permissions_sent:
                    yield ServerSentEvent(
                        data=json.dumps({"seq": permissions.seq, "jws": permissions.jws}),
                        event="tool-permissions",
                    )
                    log.info("tool_permissions_sent gateway=%s seq=%d", gateway_id, permissions.seq)
                    permissions_sent = permissions.seq
                await wake.wait()
                woken = time.perf_counter()

    return EventSourceResponse(stream(), ping=request.app.state.settings.sse_ping_s)


_REPORT_EXAMPLE = {
    "gateway_id": "gw-1",
    "generation": "7",
    "status": "FAILED",
    "snapshot_version": "",
    "reason": "NACK",
    "detail": "Envoy's error detail",
}


@router.post("/sync-reports", status_code=202)
async def post_sync_report(
    gateway_id: GatewayCredential,
    db: Db,
    body: Annotated[
        dict[str, Any],
        Body(description="stoa.inventory.v1.SyncReport as proto3 JSON", examples=[_REPORT_EXAMPLE]),
    ],
) -> GatewayStatus:
    found = unstorable(body, "")
    if found is not None:
        raise invalid(found[0].lstrip(".") or "body", found[1])
    report = inventory_pb2.SyncReport()
    try:
        json_format.ParseDict(body, report)
    except json_format.ParseError as exc:
        raise invalid("body", f"not a SyncReport: {exc}") from None
    if report.gateway_id != gateway_id:
        raise invalid("gateway_id", "must equal the gateway_id of the path")
    if report.status not in (inventory_pb2.SYNCED, inventory_pb2.FAILED):
        raise invalid("status", "must be SYNCED or FAILED")
    if report.generation < 1:
        raise invalid("generation", "must be a generation (>= 1)")
    if report.status == inventory_pb2.SYNCED and not report.snapshot_version:
        raise invalid("snapshot_version", "is required with SYNCED")
    if report.status == inventory_pb2.FAILED and report.reason == inventory_pb2.FAILURE_REASON_UNSPECIFIED:
        raise invalid("reason", "is required with FAILED")
    if await gateways.move_above(db, gateway_id, report.generation, "sync report") is not None:
        # A report about a generation this database never had: the state is what the move made it.
        return await gateways.status(db, gateway_id)
    await sync_reports.record(
        db,
        gateway_id,
        report.generation,
        inventory_pb2.SyncStatus.Name(report.status),
        inventory_pb2.FailureReason.Name(report.reason),
        report.detail,
        report.snapshot_version,
        json_format.MessageToDict(report.settings, preserving_proto_field_name=True)
        if report.HasField("settings")
        else None,
    )
    return await gateways.status(db, gateway_id)
