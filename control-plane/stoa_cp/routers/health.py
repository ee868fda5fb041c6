from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from stoa_cp.problems import Problem

router = APIRouter(prefix="/health", tags=["health"])


@router.get("/live")
async def live() -> dict[str, str]:
    return {"status": "live"}


@router.get("/ready", responses={503: {"description": "The database is unreachable"}})
async def ready(request: Request) -> JSONResponse:
    try:
        await asyncio.wait_for(request.app.state.db.ping(), timeout=2.0)
    except Exception:
        return Problem(503, "Not ready", [("database", "unreachable")]).response()
    return JSONResponse({"status": "ready"})
