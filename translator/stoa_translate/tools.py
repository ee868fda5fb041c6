"""The acceptance rules of an MCP tool, one implementation for the CP (a 422 naming the field) and the
site (the translator refuses an inventory holding a tool they refuse).

A tool is one operation of an API: `method` and `path_template` below the API's upstream; the
template's `{parameters}` come from the call's arguments, so each must be a property of
`input_schema`. Schemas are JSON Schema (2020-12) documents whose root is an object, as MCP asks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError
from stoa_proto import mcp_pb2

from stoa_translate import fields

# MCP's tool name characters (specification 2025-11-25), 1 to 128 long.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,128}$")
ANNOTATIONS = {
    "title": str,
    "readOnlyHint": bool,
    "destructiveHint": bool,
    "idempotentHint": bool,
    "openWorldHint": bool,
}
_PARAMETER = re.compile(r"\{([^{}]*)\}")
_SEPARATORS = re.compile(r"[/\\]")
_PARAMETER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_DESCRIPTION = 4000


class ToolError(ValueError):
    """A tool the rules refuse; `field` names the member (`input_schema.properties`)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field} {message}")
        self.field = field
        self.message = message


def name(value: str) -> str:
    if not TOOL_NAME.match(value):
        raise ToolError("name", "must be 1-128 characters of A-Z, a-z, 0-9, '_', '-' and '.'")
    return value


def schema(field: str, value: Any) -> dict[str, Any]:
    """A JSON Schema document whose root describes an object."""
    if not isinstance(value, Mapping):
        raise ToolError(field, "must be a JSON object (a JSON Schema)")
    try:
        Draft202012Validator.check_schema(value)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path)
        at = f" at /{where}" if where else ""
        raise ToolError(field, f"is not a valid JSON Schema{at}: {exc.message}") from None
    if value.get("type") != "object":
        raise ToolError(f"{field}.type", 'must be "object" (MCP tool arguments and results are objects)')
    return dict(value)


def annotations(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ToolError("annotations", "must be a JSON object")
    for key, item in value.items():
        kind = ANNOTATIONS.get(key)
        if kind is None:
            raise ToolError(f"annotations.{key}", f"is not one of {', '.join(ANNOTATIONS)}")
        if not isinstance(item, kind):
            raise ToolError(f"annotations.{key}", f"must be a {kind.__name__}")
    return dict(value)


def parameters(template: str) -> list[str]:
    """The `{parameter}` names of a path template, in order."""
    return _PARAMETER.findall(template)


def path_template(value: str, input_schema: Mapping[str, Any]) -> str:
    """An absolute path whose `{parameters}` are properties of `input_schema`."""
    names = parameters(value)
    for found in names:
        if not _PARAMETER_NAME.match(found):
            raise ToolError("path_template", f"parameter {{{found}}} is not a name (letters, digits, '_')")
    try:
        fields.path(_PARAMETER.sub("x", value))
    except ValueError as exc:
        raise ToolError("path_template", str(exc)) from None
    if "{" in _PARAMETER.sub("", value) or "}" in _PARAMETER.sub("", value):
        raise ToolError("path_template", "has an unbalanced '{' or '}'")
    properties = input_schema.get("properties")
    declared = set(properties) if isinstance(properties, Mapping) else set()
    for found in names:
        if found not in declared:
            raise ToolError("path_template", f"parameter {{{found}}} is not a property of input_schema")
    return value


def method(value: str, api_methods: list[str] | tuple[str, ...]) -> str:
    """An HTTP method the API accepts (any, when the API lists none)."""
    upper = value.upper()
    if upper not in fields.HTTP_METHODS:
        raise ToolError("method", f"must be one of {', '.join(fields.HTTP_METHODS)}")
    if api_methods and upper not in api_methods:
        raise ToolError("method", f"{upper} is not a method of the API ({', '.join(api_methods)})")
    return upper


def expand(template: str, arguments: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(path, the arguments left): each `{parameter}` replaced by its argument, percent-encoded as one
    path segment (a '/' or '..' in an argument cannot move the call to another path); ToolError for an
    argument that is, or could be read as, a '.' or '..' segment."""
    used = set(parameters(template))
    missing = [p for p in used if p not in arguments]
    if missing:
        raise ToolError("arguments", f"lack {', '.join(sorted(missing))} (a path parameter)")

    def segment(match: re.Match[str]) -> str:
        text = str(arguments[match.group(1)])
        # Nor '.' or '..' once an upstream has decoded its escapes or split it at '/' or '\\' (as
        # some servers do before they resolve dot segments): `..%2Fadmin` must not reach `/admin`.
        if text == "" or any(part in (".", "..") for part in _SEPARATORS.split(unquote(text))):
            raise ToolError(f"arguments.{match.group(1)}", "cannot be an empty, '.' or '..' path segment")
        return quote(text, safe="")

    return _PARAMETER.sub(segment, template), {k: v for k, v in arguments.items() if k not in used}


@dataclass(frozen=True)
class ToolDocuments:
    """The JSON members of a tool as the registry carries them (`stoa.mcp.v1.Tool`), read."""

    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    annotations: dict[str, Any] | None


def _json(field: str, text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise ToolError(field, "is not JSON") from None


def read(tool: mcp_pb2.Tool) -> ToolDocuments:
    """A tool of the registry (in the inventory and in the MCP module's policy set) by these rules, as
    the Link and the module both read it; ToolError naming the member."""
    name(tool.name)
    input_schema = schema("input_schema", _json("input_schema", tool.input_schema_json))
    output_schema = (
        schema("output_schema", _json("output_schema", tool.output_schema_json))
        if tool.output_schema_json
        else None
    )
    tool_annotations = (
        annotations(_json("annotations", tool.annotations_json)) if tool.annotations_json else None
    )
    path_template(tool.path_template, input_schema)
    method(tool.method, ())
    if (tool.budget_calls == 0) != (tool.budget_window_s == 0):
        raise ToolError("budget", "needs both calls and a window")
    return ToolDocuments(input_schema, output_schema, tool_annotations)
