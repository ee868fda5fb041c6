"""The console: a web page served by the CP at /console (plain HTML, CSS and JavaScript modules from
this package, nothing fetched from elsewhere). It signs people in at the configured issuer with the
authorization code flow and PKCE and then calls the CP API with their token, like any client; it
learns what the CP offers from the CP's own OpenAPI document. Nothing here needs a credential."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from stoa_cp.settings import Settings

ROOT = Path(__file__).resolve().parent.parent / "console"
router = APIRouter(prefix="/console", include_in_schema=False)


def static_files() -> StaticFiles:
    return StaticFiles(directory=ROOT / "static")


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _headers(settings: Settings) -> dict[str, str]:
    issuer = settings.console_sign_in_issuer
    # Scripts and styles only from the CP itself; the browser may talk to the CP and the issuer only.
    connect = "'self'" + (f" {_origin(issuer)}" if issuer else "")
    return {
        "content-security-policy": (
            f"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src {connect};"
            " base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
        ),
        # The sign-in code travels in the callback's query: never sent on as a referrer.
        "referrer-policy": "no-referrer",
        "x-content-type-options": "nosniff",
        "cache-control": "no-store",
    }


@router.get("")
@router.get("/")
@router.get("/callback")
async def page(request: Request) -> FileResponse:
    """The one page; the callback of a sign-in is the same page, which redeems the code."""
    headers = _headers(request.app.state.settings)
    return FileResponse(ROOT / "index.html", media_type="text/html", headers=headers)


@router.get("/config.json")
async def config(request: Request) -> JSONResponse:
    """Where and how the console signs in, and how it reads a token's role and tenant."""
    settings: Settings = request.app.state.settings
    return JSONResponse(
        {
            "issuer": settings.console_sign_in_issuer,
            "client_id": settings.console_client_id,
            "roles_claim": settings.roles_claim,
            "tenant_claim": settings.tenant_claim,
        },
        headers={"cache-control": "no-store"},
    )
