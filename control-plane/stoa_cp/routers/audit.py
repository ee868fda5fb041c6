from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from stoa_cp.access import Caller
from stoa_cp.dependencies import Db
from stoa_cp.principal import Role
from stoa_cp.problems import PROBLEM_RESPONSES, Problem, not_found
from stoa_cp.schemas import AuditEntry, Identifier, Timestamp
from stoa_cp.store import audit

router = APIRouter(prefix="/v1/audit", tags=["audit"], responses=PROBLEM_RESPONSES)


@router.get("")
async def read_audit(
    db: Db,
    principal: Caller,
    tenant: Annotated[Identifier | None, Query(description="Only writes to or by this tenant")] = None,
    since: Annotated[Timestamp | None, Query(alias="from", description="Inclusive lower bound")] = None,
    until: Annotated[Timestamp | None, Query(alias="to", description="Exclusive upper bound")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> list[AuditEntry]:
    """The writes on the CP API, newest first: platform admins see all, a tenant admin its tenant's."""
    if principal.role is not Role.PLATFORM_ADMIN and principal.role is not Role.TENANT_ADMIN:
        raise Problem(403, "Forbidden", [("authorization", "the audit log is for admins")])
    if principal.tenant is not None:
        if tenant is not None and tenant != principal.tenant:
            raise not_found("tenant", tenant)
        tenant = principal.tenant
    return [AuditEntry(**entry) for entry in await audit.entries(db, tenant, since, until, limit)]
