"""The translation preview of a gateway: the whole of it for platform roles, a tenant-bound caller's
own part for the others (a gateway carries every tenant's routes)."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request

from stoa_cp import preview
from stoa_cp.access import AnyCaller, Caller
from stoa_cp.dependencies import Db
from stoa_cp.problems import PROBLEM_RESPONSES, not_found, problem_responses
from stoa_cp.schemas import Preview
from stoa_cp.store import sync_reports
from stoa_cp.store.inventory import InventoryCache

router = APIRouter(
    prefix="/v1/gateways/{gateway_id}",
    tags=["gateways"],
    dependencies=[AnyCaller],
    responses=PROBLEM_RESPONSES,
)


@router.get(
    "/preview",
    responses=problem_responses(
        (409, "The settings the Link reported cannot be used for a translation"),
        (503, "validate=envoy without an Envoy binary, or Envoy did not answer in time"),
    ),
)
async def preview_gateway(
    gateway_id: str,
    request: Request,
    db: Db,
    principal: Caller,
    validate: Annotated[Literal["envoy"] | None, Query()] = None,
) -> Preview:
    """What the gateway's Link would publish for its desired state — Envoy's resources and the site
    policy sets, or the refusal it would report — by the Link's translator, with the settings it last
    reported. `validate=envoy` also runs `envoy --mode validate` on it (503 without an Envoy binary)."""
    binary = preview.envoy_binary(request.app.state.settings.envoy_binary) if validate else None
    reported = await sync_reports.reported_settings(db, gateway_id)
    cache: InventoryCache = request.app.state.inventory_cache
    current = await cache.current(db, gateway_id)
    if current is None:
        raise not_found("gateway_id", gateway_id)
    # Translating a large estate is CPU work: off the event loop.
    rendered, snapshot = await asyncio.to_thread(
        preview.render, gateway_id, current[1], reported, principal.tenant
    )
    if binary is not None and snapshot is not None:
        rendered.validation = await preview.validate(binary, snapshot)
    return rendered
