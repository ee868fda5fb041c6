"""Who may do what on the CP API.

`Authentication` (ASGI middleware) runs before any route reads a body: every `/v1/` request is
either a gateway's (its own config, events and sync reports, with the gateway credential) or a
principal's (see `principal`); anything else is refused there, whatever the body. It also writes
the audit record of every principal's write before the response leaves.

The scopes below are FastAPI dependencies that routers declare; a new tenant-owned resource mounts
its router under `/v1/tenants/{tenant_id}/` with `TenantScope` and is tenant-scoped from birth:
- `TenantScope`: objects of the path's tenant. Another tenant's are absent (404, as for an unknown
  tenant); a viewer may only read (403).
- `ApiScope`: an API named by id outside its tenant's path (deployments): the same rules, by the
  API's tenant.
- `PlatformScope`: platform objects (creating gateways, gateway policies): platform roles only (403).
Gateway lists are readable by every role; gateway-wide views give a tenant-bound caller its own part.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from stoa_cp import audit
from stoa_cp.auth import gateway_of
from stoa_cp.dependencies import Db
from stoa_cp.principal import Authenticator, Principal, Refused
from stoa_cp.problems import Problem, Taken, not_found
from stoa_cp.store import apis
from stoa_cp.store import audit as audit_log

log = logging.getLogger("stoa_cp.access")

READS = frozenset({"GET", "HEAD", "OPTIONS"})
_GATEWAY_FACING = re.compile(r"^/v1/gateways/([^/]+)/(?:config|events|sync-reports)$")

_bearer = HTTPBearer(
    auto_error=False,
    scheme_name="Bearer",
    description="An access token from a trusted issuer (roles in the roles claim, `stoa_roles` by default)"
    " or, outside production, a static admin token",
)


def _refusal(exc: Refused) -> Problem:
    if exc.status == 401:
        challenge = 'Bearer error="invalid_token"' if exc.token_given else "Bearer"
        return Problem(
            401, "Unauthorized", [("authorization", exc.message)], headers={"WWW-Authenticate": challenge}
        )
    return Problem(403, "Forbidden", [("authorization", exc.message)])


class Authentication:
    def __init__(self, app: ASGIApp, authenticator: Authenticator) -> None:
        self.app = app
        self.authenticator = authenticator

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        authorization = Headers(scope=scope).get("authorization")
        state = scope.setdefault("state", {})
        gateway_path = _GATEWAY_FACING.match(scope["path"])
        try:
            if gateway_path is not None:
                db = scope["app"].state.db
                state["gateway_id"] = await gateway_of(db, gateway_path.group(1), authorization)
                await self.app(scope, receive, send)
                return
            principal = await self.authenticator.principal(authorization)
        except Refused as exc:
            await _refusal(exc).response()(scope, receive, send)
            return
        except Problem as exc:
            await exc.response()(scope, receive, send)
            return
        state["principal"] = principal
        if scope["method"] in READS:
            await self.app(scope, receive, send)
        else:
            await self._audited(principal, scope, receive, send)

    async def _audited(self, who: Principal, scope: Scope, receive: Receive, send: Send) -> None:
        held: list[Message] = []

        async def hold(message: Message) -> None:
            held.append(message)

        draft, token = audit.begin()
        status = 500
        try:
            await self.app(scope, receive, hold)
            status = next((m["status"] for m in held if m["type"] == "http.response.start"), 500)
        finally:
            audit.end(token)
            path_ids = {k: v for k, v in scope.get("path_params", {}).items() if isinstance(v, str)}
            body_ids: dict[str, str] = {}
            if 200 <= status < 300:
                body_ids = audit.ids_in(_json(b"".join(m.get("body", b"") for m in held)))
            if draft.tenant_id is None and "tenant_id" in body_ids:
                draft.tenant_id = body_ids["tenant_id"]
            draft.object_ids = {**draft.object_ids, **body_ids, **path_ids}
            try:
                await audit_log.record(
                    scope["app"].state.db, who, scope["method"], scope["path"], status, draft
                )
            except Exception:
                log.exception(
                    "the audit record of %s %s could not be written", scope["method"], scope["path"]
                )
        for message in held:
            await send(message)


def _json(body: bytes) -> object:
    try:
        return json.loads(body)
    except ValueError:
        return None


async def caller(
    request: Request, _documented: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> Principal:
    """The principal the middleware authenticated (the bearer dependency documents the scheme)."""
    principal = getattr(request.state, "principal", None)
    if not isinstance(principal, Principal):
        raise _refusal(Refused(401, "a Bearer token is required", False))
    return principal


Caller = Annotated[Principal, Depends(caller)]


def _may_write(principal: Principal, request: Request) -> None:
    if request.method not in READS and not principal.may_write:
        raise Problem(403, "Forbidden", [("authorization", "a viewer may only read")])


async def tenant_scope(tenant_id: Annotated[str, Path()], principal: Caller, request: Request) -> Principal:
    if not principal.sees(tenant_id):
        raise not_found("tenant_id", tenant_id)
    _may_write(principal, request)
    audit.note_tenant(tenant_id)
    return principal


async def api_scope(api_id: Annotated[str, Path()], principal: Caller, request: Request, db: Db) -> Principal:
    tenant_id = await apis.tenant_of(db, api_id)
    if tenant_id is None or not principal.sees(tenant_id):
        raise not_found("api_id", api_id)
    _may_write(principal, request)
    audit.note_tenant(tenant_id)
    return principal


async def platform_scope(principal: Caller, request: Request) -> Principal:
    if principal.tenant is not None:
        raise Problem(
            403, "Forbidden", [("authorization", "platform objects need a platform-wide role (no tenant)")]
        )
    _may_write(principal, request)
    return principal


async def on_taken(request: Request, exc: Exception) -> JSONResponse:
    """An id unique across tenants is taken: only a caller that may see the holder learns it is a
    conflict (409); for any other it is another tenant's object, and answers the same 404 as every
    other such object."""
    assert isinstance(exc, Taken)
    principal = getattr(request.state, "principal", None)
    if isinstance(principal, Principal) and principal.sees(exc.holder_tenant):
        return exc.response()
    return Problem(404, "Not found", [(exc.field, f"{exc.field} {exc.value!r} is not available")]).response()


TenantScope = Depends(tenant_scope)
ApiScope = Depends(api_scope)
PlatformScope = Depends(platform_scope)
AnyCaller = Depends(caller)
