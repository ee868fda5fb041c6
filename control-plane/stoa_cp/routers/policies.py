"""Policies: tenant/api-scoped under a tenant, gateway-scoped under a gateway (reach: `store.policies`)."""

from __future__ import annotations

from typing import TypeVar

from fastapi import APIRouter, Response
from stoa_translate.policies import ListLimits

from stoa_cp import policy_config
from stoa_cp.access import PlatformScope, TenantScope
from stoa_cp.dependencies import Db, ExistingGateway, ExistingTenant, PolicyLimits
from stoa_cp.problems import PROBLEM_RESPONSES, REPEATED_CREATE, answered, invalid
from stoa_cp.schemas import (
    GatewayPolicyFields,
    GatewayPolicyIn,
    GatewayPolicyUpdate,
    PolicyOut,
    TenantPolicyFields,
    TenantPolicyIn,
    TenantPolicyUpdate,
)
from stoa_cp.store import policies

PolicyFields = TypeVar("PolicyFields", TenantPolicyFields, GatewayPolicyFields)

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


def _accepted(body: PolicyFields, policy_id: str, limits: ListLimits) -> PolicyFields:
    """`body` with its config in normal form (422 naming the field when the site would refuse it, or
    when a list of it is longer than its limit)."""
    config = policy_config.accepted(body.type, policy_id, body.config, limits)
    return body.model_copy(update={"config": config})


def _check_tenant_policy(body: TenantPolicyFields) -> None:
    if body.scope == "tenant" and body.targets:
        raise invalid("targets", "must be empty for scope 'tenant' (it applies to every route of the tenant)")


@tenant_router.post("", status_code=201, responses=REPEATED_CREATE)
async def create_tenant_policy(
    tenant_id: str, body: TenantPolicyIn, db: Db, limits: PolicyLimits, response: Response
) -> PolicyOut:
    _check_tenant_policy(body)
    policy, created = await policies.create_for_tenant(db, tenant_id, _accepted(body, body.policy_id, limits))
    return answered(response, policy, created)


@tenant_router.get("")
async def list_tenant_policies(tenant_id: ExistingTenant, db: Db) -> list[PolicyOut]:
    return await policies.list_for_tenant(db, tenant_id)


@tenant_router.get("/{policy_id}")
async def get_tenant_policy(tenant_id: ExistingTenant, policy_id: str, db: Db) -> PolicyOut:
    return await policies.get_for_tenant(db, tenant_id, policy_id)


@tenant_router.put("/{policy_id}")
async def update_tenant_policy(
    tenant_id: str, policy_id: str, body: TenantPolicyUpdate, db: Db, limits: PolicyLimits
) -> PolicyOut:
    if body.policy_id is not None and body.policy_id != policy_id:
        raise invalid("policy_id", "must equal the policy_id of the path")
    _check_tenant_policy(body)
    return await policies.update_for_tenant(db, tenant_id, policy_id, _accepted(body, policy_id, limits))


@tenant_router.delete("/{policy_id}", status_code=204)
async def delete_tenant_policy(tenant_id: str, policy_id: str, db: Db) -> Response:
    await policies.delete_for_tenant(db, tenant_id, policy_id)
    return Response(status_code=204)


@gateway_router.post("", status_code=201, responses=REPEATED_CREATE)
async def create_gateway_policy(
    gateway_id: str, body: GatewayPolicyIn, db: Db, limits: PolicyLimits, response: Response
) -> PolicyOut:
    policy, created = await policies.create_for_gateway(
        db, gateway_id, _accepted(body, body.policy_id, limits)
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
    gateway_id: str, policy_id: str, body: GatewayPolicyUpdate, db: Db, limits: PolicyLimits
) -> PolicyOut:
    if body.policy_id is not None and body.policy_id != policy_id:
        raise invalid("policy_id", "must equal the policy_id of the path")
    return await policies.update_for_gateway(db, gateway_id, policy_id, _accepted(body, policy_id, limits))


@gateway_router.delete("/{policy_id}", status_code=204)
async def delete_gateway_policy(gateway_id: str, policy_id: str, db: Db) -> Response:
    await policies.delete_for_gateway(db, gateway_id, policy_id)
    return Response(status_code=204)
