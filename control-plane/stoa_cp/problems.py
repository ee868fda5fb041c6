"""RFC 7807 problem responses: every error names the bad field and changes nothing."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Route

PROBLEM_JSON = "application/problem+json"
T = TypeVar("T")
log = logging.getLogger("stoa_cp")


class FieldError(BaseModel):
    field: str
    message: str


class ProblemBody(BaseModel):
    """The body of every error response (media type application/problem+json)."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str = ""
    errors: list[FieldError] = []


class Problem(Exception):
    def __init__(
        self,
        status: int,
        title: str,
        errors: Sequence[tuple[str, str]] = (),
        detail: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(title)
        self.headers = headers
        self.status = status
        self.title = title
        self.errors = [FieldError(field=f, message=m) for f, m in errors]
        self.detail = detail or "; ".join(f"{f}: {m}" for f, m in errors)

    def response(self, headers: dict[str, str] | None = None) -> JSONResponse:
        body = ProblemBody(title=self.title, status=self.status, detail=self.detail, errors=self.errors)
        return JSONResponse(
            body.model_dump(),
            status_code=self.status,
            media_type=PROBLEM_JSON,
            headers=headers or self.headers,
        )


def invalid(field: str, message: str) -> Problem:
    return Problem(422, "Validation failed", [(field, message)])


def not_found(field: str, value: str) -> Problem:
    return Problem(404, "Not found", [(field, f"unknown {field} {value!r}")])


def conflict(field: str, value: str) -> Problem:
    return Problem(409, "Conflict", [(field, f"{field} {value!r} already exists")])


class Taken(Problem):
    """A conflict on an id unique across tenants (api_id, policy_id, path_prefix). Whose object holds
    it decides what the caller may learn: `stoa_cp.access` answers it."""

    def __init__(self, field: str, value: str, holder_tenant: str | None) -> None:
        super().__init__(409, "Conflict", [(field, f"{field} {value!r} already exists")])
        self.field = field
        self.value = value
        self.holder_tenant = holder_tenant


_BODY_UNPARSABLE = "There was an error parsing the body"  # FastAPI's text for an undecodable body


def allowed_methods(request: Request) -> list[str]:
    """Every method some route serves on the request's path."""
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.methods and route.path_regex.match(request.scope["path"]):
            methods |= route.methods
    return sorted(methods)


def field_path(loc: Sequence[str | int]) -> str:
    """('body', 'config', 'allowedOrigins', 1) -> 'config.allowedOrigins[1]'."""
    parts = list(loc)
    if parts and parts[0] in ("body", "path", "query", "header", "cookie"):
        parts = parts[1:]
    out = ""
    for part in parts:
        if part == "[key]":  # pydantic's marker for a mapping's key: the field is the key itself
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "body"


def install(app: FastAPI) -> None:
    async def on_problem(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, Problem)
        return exc.response()

    async def on_validation(_: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        errors = []
        # A body told apart by its `type` (policies) puts that tag in each error's location.
        tag = exc.body.get("type") if isinstance(exc.body, dict) else None
        for err in exc.errors():
            if err.get("type") == "union_tag_invalid":
                ctx = err.get("ctx") or {}
                supported = str(ctx.get("expected_tags", "")).replace("'", "")
                errors.append(
                    ("type", f"{ctx.get('tag')!r} is not a supported type (supported: {supported})")
                )
                continue
            if err.get("type") == "union_tag_not_found":
                errors.append(("type", "is required"))
                continue
            loc = tuple(err.get("loc", ()))
            if len(loc) > 1 and loc[0] == "body" and tag is not None and loc[1] == tag:
                err = {**err, "loc": (loc[0], *loc[2:])}
            if err.get("type") == "json_invalid":
                # loc is ("body", character offset): the field is the body itself.
                where = err.get("loc", ("body", 0))[-1]
                reason = (err.get("ctx") or {}).get("error", "malformed")
                errors.append(("body", f"is not valid JSON ({reason} at character {where})"))
                continue
            message = str(err.get("msg", "invalid"))
            # Custom validators raise ValueError("..."): pydantic prefixes it, which helps nobody.
            message = message.removeprefix("Value error, ")
            errors.append((field_path(err.get("loc", ())), message))
        return Problem(422, "Validation failed", errors).response()

    async def on_http(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        headers = dict(exc.headers) if exc.headers else {}
        if exc.status_code == 405:
            # The router names only the first route of the path; the path serves all of these.
            headers["Allow"] = ", ".join(allowed_methods(request))
            return Problem(
                405, "Method not allowed", [("method", f"{request.method} is not served here")]
            ).response(headers)
        if exc.status_code == 400 and exc.detail == _BODY_UNPARSABLE:
            # Bytes that are not UTF-8 text never reach the JSON parser (and its 422).
            return Problem(400, "Bad request", [("body", "is not JSON text in UTF-8")]).response()
        return Problem(exc.status_code, str(exc.detail)).response(headers or None)

    async def on_unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error", exc_info=exc)
        return Problem(500, "Internal error").response()

    app.add_exception_handler(Problem, on_problem)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(StarletteHTTPException, on_http)
    app.add_exception_handler(Exception, on_unexpected)


REPEATED_CREATE: dict[int | str, dict[str, object]] = {
    200: {"description": "Created earlier with this same body: the stored resource, nothing changed"}
}


def answered(response: Response, resource: T, created: bool) -> T:
    """201 when this call created the resource, 200 when a repeated create found it as asked."""
    if not created:
        response.status_code = 200
    return resource


def problem_responses(*statuses: tuple[int, str]) -> dict[int | str, dict[str, object]]:
    """OpenAPI responses with the problem body, for each (status, description)."""
    return {
        status: {"model": ProblemBody, "content": {PROBLEM_JSON: {}}, "description": desc}
        for status, desc in statuses
    }


PROBLEM_RESPONSES = problem_responses(
    (400, "The body is not JSON text in UTF-8"),
    (401, "No credential, or one that does not verify"),
    (403, "A credential whose role does not allow this (or another gateway's credential)"),
    (404, "Unknown resource, or another tenant's (the field is named)"),
    (409, "Conflict with the stored state (the field is named)"),
    (413, "Request body over its limit (the setting is named)"),
    (422, "Invalid input (each bad field is named)"),
    (503, "The database did not answer within its bounds (Retry-After)"),
)
