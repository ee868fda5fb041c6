"""Policies: tenant/api-scoped under a tenant, gateway-scoped under a gateway (reach: `store.policies`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response
from stoa_translate.policies import ListLimits

from stoa_cp import policy_config
from stoa_cp.access import PlatformScope, TenantScope
from stoa_cp.dependencies import Db, ExistingGateway, ExistingTenant, PolicyLimits
from stoa_cp.problems import PROBLEM_RESPONSES, REPEATED_CREATE, answered
from stoa_cp.schemas import (
    GatewayPolicyBody,
    GatewayPolicyIn,
    GatewayPolicyPut,
    PolicyOut,
    TenantPolicyBody,
    TenantPolicyIn,
    TenantPolicyPut,
)
from stoa_cp.store import policies

tenant_router = APIRouter(
    prefix="/v1/tenants/{tenant_id}/policies",
    tags=["policies"],
    dependencies=[TenantScope],
    responses=PROBLEM_RESPONSES,
)
gateway_router = APIRouter(
    prefix="/v1/gateways/{gateway_id}/policies",
    tags=["policies"],
    dependencies=[PlatformScope],
    responses=PROBLEM_RESPONSES,
)


def _accepted(body: Any, policy_id: str, limits: ListLimits) -> dict[str, Any]:
    """The config in the normal form the site's rules give it (422 naming the field if they refuse,
    or when a list of it is longer than its limit)."""
    return policy_config.accepted(
        body.type, policy_id, body.config.model_dump(exclude_unset=True, by_alias=True), limits
    )


def _tenant_policy(body: Any, policy_id: str, limits: ListLimits) -> TenantPolicyIn:
    config = _accepted(body, policy_id, limits)
    return TenantPolicyIn(
        policy_id=policy_id, type=body.type, config=config, scope=body.scope, targets=body.targets
    )


def _gateway_policy(body: Any, policy_id: str, limits: ListLimits) -> GatewayPolicyIn:
    return GatewayPolicyIn(policy_id=policy_id, type=body.type, config=_accepted(body, policy_id, limits))


@tenant_router.post("", status_code=201, responses=REPEATED_CREATE)
async def create_tenant_policy(
    tenant_id: str, body: TenantPolicyBody, db: Db, limits: PolicyLimits, response: Response
) -> PolicyOut:
    policy, created = await policies.create_for_tenant(
        db, tenant_id, _tenant_policy(body, body.policy_id, limits)
    )
    return answered(response, policy, created)


@tenant_router.get("")
async def list_tenant_policies(tenant_id: ExistingTenant, db: Db) -> list[PolicyOut]:
    return await policies.list_for_tenant(db, tenant_id)


@tenant_router.get("/{policy_id}")
async def get_tenant_policy(tenant_id: ExistingTenant, policy_id: str, db: Db) -> PolicyOut:
    return await policies.get_for_tenant(db, tenant_id, policy_id)


@tenant_router.put("/{policy_id}")
async def update_tenant_policy(
    tenant_id: str, policy_id: str, body: TenantPolicyPut, db: Db, limits: PolicyLimits
) -> PolicyOut:
    """PUT replaces the policy; the id is the path's."""
    return await policies.update_for_tenant(db, tenant_id, policy_id, _tenant_policy(body, policy_id, limits))


@tenant_router.delete("/{policy_id}", status_code=204)
async def delete_tenant_policy(tenant_id: str, policy_id: str, db: Db) -> Response:
    await policies.delete_for_tenant(db, tenant_id, policy_id)
    return Response(status_code=204)


@gateway_router.post("", status_code=201, responses=REPEATED_CREATE)
async def create_gateway_policy(
    gateway_id: str, body: GatewayPolicyBody, db: Db, limits: PolicyLimits, response: Response
) -> PolicyOut:
    policy, created = await policies.create_for_gateway(
        db, gateway_id, _gateway_policy(body, body.policy_id, limits)
    )
    return answered(response, policy, created)


@gateway_router.get("")
async def list_gateway_policies(gateway_id: ExistingGateway, db: Db) -> list[PolicyOut]:
    return await policies.list_for_gateway(db, gateway_id)


@gateway_router.get("/{policy_id}")
async def get_gateway_policy(gateway_id: ExistingGateway, policy_id: str, db: Db) -> PolicyOut:
    return await policies.get_for_gateway(db, gateway_id, policy_id)


@gateway_router.put("/{policy_id}")
async def update_gateway_policy(
    gateway_id: str, policy_id: str, body: GatewayPolicyPut, db: Db, limits: PolicyLimits
) -> PolicyOut:
    """PUT replaces the policy; the id is the path's."""
    return await policies.update_for_gateway(
        db, gateway_id, policy_id, _gateway_policy(body, policy_id, limits)
    )


@gateway_router.delete("/{policy_id}", status_code=204)
async def delete_gateway_policy(gateway_id: str, policy_id: str, db: Db) -> Response:
    await policies.delete_for_gateway(db, gateway_id, policy_id)
    return Response(status_code=204)
