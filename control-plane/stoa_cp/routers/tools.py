"""MCP tools of a tenant, their grants and revocations (tenant-scoped, audited like every write)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from stoa_cp.access import AnyCaller
from stoa_cp.dependencies import AppServices
from stoa_cp.problems import PROBLEM_RESPONSES, Problem
from stoa_cp.routers import tenant_objects
from stoa_cp.routers.tenant_objects import Resource
from stoa_cp.schemas import (
    ToolGrantIn,
    ToolIn,
    ToolRevocationIn,
    ToolUpdate,
)
from stoa_cp.store import tools

router = tenant_objects.router(
    "mcp tools",
    Resource(
        collection="/tools",
        singular="tool",
        plural="tools",
        store=tools.objects,
        create_body=ToolIn,
        update_body=ToolUpdate,
        docs={
            "create": "A tool: one operation (`method`, `path_template`) of one of the tenant's HTTP APIs.",
            "update": "PUT replaces the tool; the name is the path's.",
            "delete": "Delete the tool and its grants.",
        },
    ),
    Resource(
        collection="/tool-grants",
        singular="grant",
        plural="grants",
        store=tools.grants,
        create_body=ToolGrantIn,
        get=False,
        docs={
            "create": "Grant the tool to the listed consumers and to any caller holding one of the scopes."
        },
    ),
    Resource(
        collection="/tool-revocations",
        singular="revocation",
        plural="revocations",
        store=tools.revocations,
        create_body=ToolRevocationIn,
        get=False,
        docs={
            "create": "Revoke the tool for one consumer (or for everyone without `consumer`),"
            " over any grant.",
            "delete": "Lift the revocation.",
        },
    ),
)
keys_router = APIRouter(tags=["mcp tools"], responses=PROBLEM_RESPONSES)


@keys_router.get("/v1/tool-permissions/keys", dependencies=[AnyCaller])
async def signing_keys(services: AppServices) -> dict[str, Any]:
    """The public keys that sign tool permissions (a JWKS), for the sites to pin by kid."""
    signer = services.signer
    if signer is None:
        raise Problem(404, "Not found", [("keys", "this CP signs no tool permissions (no signing key)")])
    return signer.jwks()
