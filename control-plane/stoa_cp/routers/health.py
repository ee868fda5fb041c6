from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from stoa_cp.problems import Problem

router = APIRouter(prefix="/health", tags=["health"])


@router.get("/live")
async def live() -> dict[str, str]:
    return {"status": "live"}


@router.get("/ready", responses={503: {"description": "The database did not answer within the bound"}})
async def ready(request: Request) -> JSONResponse:
    """Ready when the database answers a round trip within `ready_timeout_s` (whatever its own state)."""
    settings = request.app.state.settings
    try:
        await request.app.state.db.ping(settings.ready_timeout_s)
    except Exception:
        headers = {"Retry-After": str(settings.db_retry_after_s)}
        return Problem(503, "Not ready", [("database", "unreachable")], headers=headers).response()
    return JSONResponse({"status": "ready"})
