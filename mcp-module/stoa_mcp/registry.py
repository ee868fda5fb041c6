"""The tool registry the Link serves (McpPolicySet): the MCP routes of the gateway and the tools of
their tenants, compiled once per policy set (argument validators, the MCP tool descriptions)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from stoa_ops.policy_sets import Refused
from stoa_proto import mcp_pb2


class RegistryError(Refused):
    """A policy set the module cannot use (NACKed with this message; the one in force stays)."""


@dataclass(frozen=True)
class CompiledTool:
    tenant_id: str
    name: str
    api_id: str
    method: str
    path_template: str
    upstream_url: str
    timeout_ms: int
    input_validator: Draft202012Validator
    output_validator: Draft202012Validator | None
    description: types.Tool
    # Calls per window per consumer; None: no budget.
    budget: tuple[int, int] | None = None


@dataclass(frozen=True)
class Registry:
    version: str = ""
    generation: int = 0
    # api_id → tenant of each MCP route.
    routes: dict[str, str] = field(default_factory=dict)
    # (tenant, name) → tool.
    tools: dict[tuple[str, str], CompiledTool] = field(default_factory=dict)

    def tenant_tools(self, tenant_id: str) -> list[CompiledTool]:
        return [tool for (tenant, _), tool in sorted(self.tools.items()) if tenant == tenant_id]


def _schema(text: str, where: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
        Draft202012Validator.check_schema(value)
    except (ValueError, SchemaError) as exc:
        raise RegistryError(f"{where} is not a JSON Schema: {exc}") from None
    if not isinstance(value, dict):
        raise RegistryError(f"{where} is not a JSON object")
    return value


def compile_policy_set(policy_set: mcp_pb2.McpPolicySet) -> Registry:
    routes = {route.api_id: route.tenant_id for route in policy_set.routes}
    tools: dict[tuple[str, str], CompiledTool] = {}
    for tool in policy_set.tools:
        where = f"tool {tool.tenant_id}/{tool.name}"
        if (tool.tenant_id, tool.name) in tools:
            raise RegistryError(f"{where}: duplicate")
        input_schema = _schema(tool.input_schema_json, f"{where}: input_schema")
        output_schema = (
            _schema(tool.output_schema_json, f"{where}: output_schema") if tool.output_schema_json else None
        )
        try:
            annotations = json.loads(tool.annotations_json) if tool.annotations_json else None
            description = types.Tool(
                name=tool.name,
                description=tool.description,
                input_schema=input_schema,
                output_schema=output_schema,
                annotations=types.ToolAnnotations(**annotations) if annotations else None,
            )
        except (ValueError, TypeError) as exc:
            raise RegistryError(f"{where}: {exc}") from None
        tools[(tool.tenant_id, tool.name)] = CompiledTool(
            tenant_id=tool.tenant_id,
            name=tool.name,
            api_id=tool.api_id,
            method=tool.method,
            path_template=tool.path_template,
            upstream_url=tool.upstream_url,
            timeout_ms=tool.timeout_ms,
            input_validator=Draft202012Validator(input_schema),
            output_validator=Draft202012Validator(output_schema) if output_schema is not None else None,
            description=description,
            budget=(tool.budget_calls, tool.budget_window_s) if tool.budget_calls else None,
        )
    return Registry(policy_set.version, policy_set.generation, routes, tools)
