"""Readiness and metrics on the operator endpoint. Ready = the module can enforce: a valid artifact
is held (503 `no_artifact` until one arrives, `artifact_expired` once it lapsed) and the tool registry
is loaded (`no_registry`)."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from stoa_mcp.server import McpModule

METRICS_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def metrics_text(module: McpModule) -> str:
    held = module.permissions.held
    lines = [
        "# HELP stoa_mcp_tool_calls_total tools/call answered, by outcome.",
        "# TYPE stoa_mcp_tool_calls_total counter",
        *(f'stoa_mcp_tool_calls_total{{outcome="{k}"}} {v}' for k, v in sorted(module.calls.items())),
        "# HELP stoa_mcp_permissions_refused_total Signed tool permissions refused, by reason.",
        "# TYPE stoa_mcp_permissions_refused_total counter",
        *(
            f"stoa_mcp_permissions_refused_total{{reason={_label(k)}}} {v}"
            for k, v in sorted(module.permissions.refusals.items())
        ),
        "# HELP stoa_mcp_permissions_seq The seq of the tool permissions held (0: none).",
        "# TYPE stoa_mcp_permissions_seq gauge",
        f"stoa_mcp_permissions_seq {held.seq if held else 0}",
        "# HELP stoa_mcp_permissions_expires_at Expiry of the tool permissions held (Unix time).",
        "# TYPE stoa_mcp_permissions_expires_at gauge",
        f"stoa_mcp_permissions_expires_at {held.expires_at if held else 0}",
        "# HELP stoa_mcp_ready 1 when the module can enforce.",
        "# TYPE stoa_mcp_ready gauge",
        f"stoa_mcp_ready {0 if module.not_ready() else 1}",
    ]
    return "\n".join(lines) + "\n"


def _label(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")[:120] + '"'


def operator_app(module: McpModule) -> Starlette:
    async def live(_: Request) -> Response:
        return JSONResponse({"status": "live"})

    async def ready(_: Request) -> Response:
        reason = module.not_ready()
        if reason is not None:
            return JSONResponse({"status": "not_ready", "reason": reason}, status_code=503)
        held = module.permissions.held
        assert held is not None
        return JSONResponse(
            {"status": "ready", "seq": held.seq, "kid": held.kid, "expires_at": held.expires_at}
        )

    async def metrics(_: Request) -> Response:
        return PlainTextResponse(metrics_text(module), media_type=METRICS_TYPE)

    return Starlette(
        routes=[
            Route("/health/live", live, methods=["GET"]),
            Route("/health/ready", ready, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )
