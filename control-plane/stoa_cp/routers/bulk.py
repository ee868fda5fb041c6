from __future__ import annotations

from collections import Counter

from fastapi import APIRouter, Request

from stoa_cp import audit
from stoa_cp.access import TenantScope
from stoa_cp.dependencies import Db
from stoa_cp.problems import PROBLEM_RESPONSES, Problem
from stoa_cp.schemas import BulkIn, BulkOut
from stoa_cp.store import apis, bulk

PATH = "/v1/tenants/{tenant_id}/bulk"
router = APIRouter(tags=["bulk"], dependencies=[TenantScope], responses=PROBLEM_RESPONSES)


def _check(body: BulkIn, max_items: int) -> None:
    """The rules a single call cannot break by itself: counts, and no item named twice."""
    items = len(body.apis) + sum(len(g.api_ids) for g in (*body.deploy, *body.undeploy))
    if items > max_items:
        raise Problem(
            422,
            "Limit exceeded",
            [
                (
                    "body",
                    f"{items} APIs and deployments; the limit is {max_items} per request (bulk_max_items)",
                )
            ],
        )
    errors: list[tuple[str, str]] = []
    for i, api in enumerate(body.apis):
        # The kind's rules of a single call (an MCP route: no upstream, a token), named by position.
        problem = api.kind_problem()
        if problem is not None:
            errors.append((f"apis[{i}].{problem[0]}", problem[1]))
    for field, values in (
        ("api_id", [a.api_id for a in body.apis]),
        ("path_prefix", [apis.columns(a.api_id, a)["path_prefix"] for a in body.apis]),
    ):
        twice = {v for v, n in Counter(values).items() if n > 1}
        errors.extend(
            (f"apis[{i}].{field}", f"{field} {v!r} is given more than once")
            for i, v in enumerate(values)
            if v in twice
        )
    seen: dict[tuple[str, str], str] = {}
    for kind, groups in (("deploy", body.deploy), ("undeploy", body.undeploy)):
        for i, group in enumerate(groups):
            for j, api_id in enumerate(group.api_ids):
                where = f"{kind}[{i}].api_ids[{j}]"
                first = seen.setdefault((group.gateway_id, api_id), where)
                if first != where:
                    errors.append(
                        (where, f"api_id {api_id!r} on {group.gateway_id!r} is already named at {first}")
                    )
    if errors:
        raise Problem(422, "Validation failed", errors)


@router.post(PATH)
async def publish_bulk(tenant_id: str, body: BulkIn, request: Request, db: Db) -> BulkOut:
    """Create or replace many APIs of the tenant and deploy or undeploy them, all or nothing, in one
    transaction: each gateway it changes gets exactly one new generation. Every item is validated as
    by the single calls (`POST .../apis`, `PUT .../deployments/{api_id}`, `DELETE` of a deployment);
    any refusal names the item (`apis[3].upstream_url`) and stores nothing."""
    settings = request.app.state.settings
    _check(body, settings.bulk_max_items)
    published = await bulk.publish(db, tenant_id, body, settings.max_routes_per_tenant)
    # The audit names the APIs this request changed (created, replaced, deployed or undeployed).
    touched = {*published.created, *published.updated}
    for api_ids in (*published.deployed.values(), *published.undeployed.values()):
        touched.update(api_ids)
    if touched:
        audit.note_objects({"api_ids": ",".join(sorted(touched))})
    return published
