"""Request and response bodies of the CP API (validation lives with the field it guards)."""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Annotated, Any, Literal, Union
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PlainValidator,
    StrictBool,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails
from stoa_translate import fields
from stoa_translate import tools as tool_rules
from stoa_translate.jwks import MAX_KEYS
from stoa_translate.policies.kind import MAX_DOCUMENT, MAX_TEXT, MAX_UINT32
from typing_extensions import TypeAliasType

from stoa_cp import syntax

Identifier = Annotated[str, syntax.ID]
# JSON numbers travel in the inventory as protobuf Struct doubles: larger integers would not survive.
MAX_JSON_INTEGER = 2**53
MAX_URL_LENGTH = fields.MAX_URL_LENGTH


def unstorable(value: object, where: str) -> tuple[str, str] | None:
    """(field, why) for the first part of a JSON value the store or the inventory cannot carry as
    given (NUL or unpaired surrogates in text, NaN/Infinity, integers beyond ±2^53), else None."""
    if isinstance(value, str):
        if "\x00" in value:
            return where, "must not contain a NUL character"
        try:
            value.encode()
        except UnicodeEncodeError:
            return where, "must be valid Unicode text (no unpaired surrogates)"
    elif isinstance(value, float) and not math.isfinite(value):
        return where, "must be a finite number"
    elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_JSON_INTEGER:
        return where, f"must be an integer within ±{MAX_JSON_INTEGER}"
    elif isinstance(value, dict):
        for key, item in value.items():
            found = unstorable(key, where) or unstorable(item, f"{where}.{key}")
            if found:
                return found
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found = unstorable(item, f"{where}[{i}]")
            if found:
                return found
    return None


def _storable(value: Any) -> Any:
    found = unstorable(value, "")
    if found:
        where, why = found
        raise ValueError(f"{why} (at {where.lstrip('.')})" if where else why)
    return value


def _upstream_url(value: str) -> str:
    fields.upstream_url(value)  # the site's rule (ValueError names what is wrong)
    return value


def _path_prefix(value: str) -> str:
    # Stored as the site matches it (`/a/` is `/a`), so that two prefixes the site would take for one
    # are one conflict here, not a gateway's every later inventory refused.
    return fields.path(value)


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL")
    # Credentials in a URL would be stored, shown and echoed in errors: never accepted.
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials")
    return value


def _json_integer(value: object) -> object:
    # JSON has one number type: 5.0 is the integer 5, but "5" and true are not integers.
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError("must be a whole number")
    return value


def _no_default(schema: dict[str, Any]) -> None:
    # Absent is not null: the field is optional, but null is not one of its values.
    schema.pop("default", None)


def whole(low: int, high: int) -> Any:
    """An integer from `low` to `high` (the bounds inside, so that the schema publishes them)."""
    return Annotated[int, Field(ge=low, le=high), BeforeValidator(_json_integer)]


def _rfc3339(value: object) -> object:
    # The published format is date-time (RFC 3339): a bare number or a date alone is not one.
    if not isinstance(value, str) or not _RFC3339.match(value):
        raise ValueError("must be an RFC 3339 date-time with a zone (2026-01-01T00:00:00Z)")
    return value


_RFC3339 = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)

Name = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(_storable), syntax.TEXT]
JsonObject = Annotated[dict[str, Any], AfterValidator(_storable)]
UpstreamUrl = Annotated[
    str,
    StringConstraints(max_length=MAX_URL_LENGTH),
    AfterValidator(_upstream_url),
    syntax.UPSTREAM_URL,
]
PathPrefix = Annotated[
    str, StringConstraints(max_length=MAX_URL_LENGTH), AfterValidator(_path_prefix), syntax.PATH
]
# Either case is accepted and stored upper-case (`get` → `GET`).
MethodName = Literal[
    "GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS",
    "get", "head", "post", "put", "patch", "delete", "options",
]  # fmt: skip
Methods = Annotated[list[MethodName], Field(min_length=1), AfterValidator(fields.methods)]
Scope = Annotated[str, StringConstraints(max_length=fields.MAX_SCOPE_LENGTH), syntax.SCOPE]
Scopes = Annotated[list[Scope], Field(max_length=fields.MAX_SCOPES), AfterValidator(fields.scopes)]
HttpUrl = Annotated[
    str,
    StringConstraints(max_length=MAX_URL_LENGTH),
    AfterValidator(_storable),
    AfterValidator(_http_url),
    syntax.HTTP_URL,
]
Timestamp = Annotated[AwareDatetime, BeforeValidator(_rfc3339)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


# -- tenants ------------------------------------------------------------------------------------
class TenantIn(Strict):
    tenant_id: Identifier
    name: Name


class TenantOut(BaseModel):
    tenant_id: str
    name: str


# -- APIs ---------------------------------------------------------------------------------------
def _key_header(value: str) -> str:
    return fields.key_header(value)


KeyHeader = Annotated[str, StringConstraints(max_length=64), AfterValidator(_key_header)]


class ApiAuth(Strict):
    model_config = ConfigDict(
        extra="forbid",
        # The envelope carries a verified token's identity: never with mode none.
        json_schema_extra={
            "not": {
                "required": ["mode", "envelope"],
                "properties": {"mode": {"const": "none"}, "envelope": {"const": True}},
            }
        },
    )

    mode: Literal["jwt", "none", "api_key"] = "jwt"
    scopes: Scopes = []
    # The upstream also gets the client's credential (by default it is removed once checked).
    forward_credential: StrictBool = False
    # The upstream gets the signed identity envelope; the authorization service then decides the API.
    envelope: StrictBool = False

    @field_validator("envelope")
    @classmethod
    def _envelope_needs_a_token(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("mode") == "none":
            raise ValueError("the identity envelope carries a verified token's identity: mode must be jwt")
        return value

    # api_key: the request header holding the key (x-api-key when not given). Never the query string.
    key_header: KeyHeader | None = None
    # jwt: the token's consumer (by its azp or client_id claim) must hold an active subscription.
    subscription: bool = False

    # A field of another mode is refused, not ignored (wherever an API is written: one, or in bulk).
    @field_validator("key_header")
    @classmethod
    def _key_header_needs_api_key(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and info.data.get("mode") != "api_key":
            raise ValueError("is only for mode 'api_key'")
        return value

    @field_validator("subscription")
    @classmethod
    def _subscription_needs_jwt(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("mode") != "jwt":
            raise ValueError("is only for mode 'jwt'")
        return value


class ApiAuthIn(ApiAuth):
    """What a write may say (stored APIs are read back as `ApiAuth`, whatever an older CP accepted)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                # The envelope carries a verified token's identity: never with mode none.
                {
                    "not": {
                        "required": ["mode", "envelope"],
                        "properties": {"mode": {"const": "none"}, "envelope": {"const": True}},
                    }
                },
                # Mode none consumes no credential: there is none to forward.
                {
                    "not": {
                        "required": ["mode", "forward_credential"],
                        "properties": {"mode": {"const": "none"}, "forward_credential": {"const": True}},
                    }
                },
            ]
        },
    )

    @field_validator("forward_credential")
    @classmethod
    def _forwarding_needs_a_credential(cls, value: bool, info: ValidationInfo) -> bool:
        if value and info.data.get("mode") == "none":
            raise ValueError(
                "mode none consumes no credential, so there is none to forward: the upstream already "
                "gets the client's authorization header as sent"
            )
        return value


class ApiFields(Strict):
    model_config = ConfigDict(
        extra="forbid",
        # Kind http needs its upstream_url; kind mcp has none and is always called with a token.
        json_schema_extra={
            "if": {"required": ["kind"], "properties": {"kind": {"const": "mcp"}}},
            "then": {
                "properties": {
                    "upstream_url": {"type": "null"},
                    "auth": {"properties": {"mode": {"const": "jwt"}}},
                }
            },
            "else": {"required": ["upstream_url"], "properties": {"upstream_url": {"type": "string"}}},
        },
    )

    name: Name
    # "http": proxied to upstream_url; "mcp": an MCP route answered by the site's MCP module with the
    # tools of the API's tenant (no upstream_url; identity from the signed envelope, so always a token).
    kind: Literal["http", "mcp"] = "http"
    upstream_url: UpstreamUrl | None = None
    path_prefix: PathPrefix | None = None
    methods: Methods
    timeout_ms: whole(1, 3_600_000) | None = None
    auth: ApiAuthIn = Field(default_factory=ApiAuthIn)

    @model_validator(mode="wrap")
    @classmethod
    def _upstream_of_http(cls, data: Any, handler: ModelWrapValidatorHandler[ApiFields]) -> ApiFields:
        """An HTTP API's upstream_url is required: named as missing with the other missing fields."""
        missing = (
            isinstance(data, dict) and data.get("kind", "http") == "http" and data.get("upstream_url") is None
        )
        error: InitErrorDetails = {"type": "missing", "loc": ("upstream_url",), "input": data}
        try:
            model = handler(data)
        except ValidationError as exc:
            if not missing:
                raise
            details: list[InitErrorDetails] = [
                {k: v for k, v in e.items() if k in ("type", "loc", "input", "ctx")}  # type: ignore[misc]
                for e in exc.errors()
            ]
            raise ValidationError.from_exception_data(exc.title, [*details, error]) from None
        if missing:
            raise ValidationError.from_exception_data(cls.__name__, [error])
        return model

    def kind_problem(self) -> tuple[str, str] | None:
        """(field, why) when the fields do not fit the kind; sets the kind's normal form otherwise."""
        if self.kind == "http" and self.upstream_url is None:
            return "upstream_url", "is required for an API of kind http"
        if self.kind == "mcp":
            if self.upstream_url is not None:
                return (
                    "upstream_url",
                    "must be absent for an API of kind mcp (the site's MCP module answers it)",
                )
            if self.auth.mode != "jwt":
                return "auth.mode", "must be jwt for an API of kind mcp (its callers are identified)"
            # Normal form: the module takes the caller's identity only from the signed envelope.
            self.auth.envelope = True
        return None


class ApiIn(ApiFields):
    api_id: Identifier


class ApiUpdate(ApiFields):
    """PUT replaces every field; the id is the path's (an API cannot be renamed)."""


class ApiOut(BaseModel):
    api_id: str
    tenant_id: str
    name: str
    kind: str
    upstream_url: str | None
    path_prefix: str
    methods: list[str]
    timeout_ms: int | None
    auth: ApiAuth
    deployed_on: list[str]


# -- MCP tools, grants, revocations ---------------------------------------------------------------
def _rule(check: Any) -> Any:
    """A tool rule as a validator (its ToolError becomes a 422 naming the member)."""

    def validate(value: Any) -> Any:
        try:
            return check(value)
        except tool_rules.ToolError as exc:
            raise ValueError(exc.message) from None

    return validate


ToolName = Annotated[
    str,
    AfterValidator(_rule(tool_rules.name)),
    syntax.Syntax(
        tool_rules.TOOL_NAME.pattern, "must be 1-128 characters of A-Z, a-z, 0-9, '_', '-' and '.'"
    ),
]


class ToolBudget(Strict):
    """At most `calls` calls per `window_seconds` per consumer (counted by the MCP module, fail closed)."""

    calls: int = Field(ge=1, le=1_000_000_000)
    window_seconds: int = Field(ge=1, le=31 * 24 * 3600)


class ToolFields(Strict):
    description: Annotated[
        str, StringConstraints(min_length=1, max_length=tool_rules.MAX_DESCRIPTION), AfterValidator(_storable)
    ]
    input_schema: JsonObject
    output_schema: JsonObject | None = None
    annotations: JsonObject | None = None
    api_id: Identifier
    method: Annotated[str, StringConstraints(min_length=1, max_length=16)]
    path_template: Annotated[str, StringConstraints(min_length=1, max_length=MAX_URL_LENGTH)]
    budget: ToolBudget | None = None

    def check(self) -> None:
        """The translator's rules, which the site applies to the same tool (ToolError names the member)."""
        tool_rules.schema("input_schema", self.input_schema)
        if self.output_schema is not None:
            tool_rules.schema("output_schema", self.output_schema)
        if self.annotations is not None:
            tool_rules.annotations(self.annotations)
        tool_rules.path_template(self.path_template, self.input_schema)


class ToolIn(ToolFields):
    name: ToolName


class ToolUpdate(ToolFields):
    """PUT replaces every field; the name is the path's (a tool cannot be renamed)."""


class ToolOut(BaseModel):
    tenant_id: str
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    annotations: dict[str, Any] | None
    api_id: str
    method: str
    path_template: str
    budget: ToolBudget | None = None


class ToolGrantIn(Strict):
    model_config = ConfigDict(
        extra="forbid",
        # A grant names consumers or scopes (or both): it grants nobody otherwise.
        json_schema_extra={
            "anyOf": [
                {"required": ["consumers"], "properties": {"consumers": {"minItems": 1}}},
                {"required": ["scopes"], "properties": {"scopes": {"minItems": 1}}},
            ]
        },
    )

    grant_id: Identifier
    tool: ToolName
    consumers: list[
        Annotated[
            str,
            StringConstraints(min_length=1, max_length=256),
            AfterValidator(_storable),
            syntax.NO_NUL,
        ]
    ] = []
    scopes: Scopes = []

    @model_validator(mode="after")
    def _someone(self) -> ToolGrantIn:
        if not self.consumers and not self.scopes:
            raise ValueError("a grant names consumers or scopes (or both): it grants nobody otherwise")
        return self


class ToolGrantOut(BaseModel):
    grant_id: str
    tenant_id: str
    tool: str
    consumers: list[str]
    scopes: list[str]


class ToolRevocationIn(Strict):
    revocation_id: Identifier
    tool: ToolName
    # Absent: the tool is revoked for every caller.
    consumer: (
        Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(_storable)] | None
    ) = None


class ToolRevocationOut(BaseModel):
    revocation_id: str
    tenant_id: str
    tool: str
    consumer: str | None


# -- gateways and deployments --------------------------------------------------------------------
class GatewayIn(Strict):
    gateway_id: Identifier
    name: Name


class GatewayOut(BaseModel):
    gateway_id: str
    name: str
    generation: int


class GatewayCreated(GatewayOut):
    credential: str | None = Field(
        description="Shown once, by the answer that registered the gateway (null in the answer to a "
        "repeated registration); the CP stores only its SHA-256 digest"
    )


class DeploymentOut(BaseModel):
    gateway_id: str
    api_id: str
    generation: int = Field(description="The gateway's generation after this request")
    changed: bool


class BulkDeployments(Strict):
    gateway_id: Identifier
    api_ids: list[Identifier] = Field(min_length=1)


class BulkIn(Strict):
    """APIs of the tenant (created, or replaced as by PUT) and deployments, published together."""

    apis: list[ApiIn] = []
    deploy: list[BulkDeployments] = []
    undeploy: list[BulkDeployments] = []


class BulkOut(BaseModel):
    created: list[str] = Field(description="api_ids created by this request")
    updated: list[str] = Field(description="api_ids whose fields this request changed")
    deployed: dict[str, list[str]] = Field(description="gateway_id -> api_ids newly deployed there")
    undeployed: dict[str, list[str]] = Field(description="gateway_id -> api_ids removed there")
    changed: list[str] = Field(description="Gateways that got exactly one new generation")
    generations: dict[str, int] = Field(description="gateway_id -> its generation after this request")


class LastReport(BaseModel):
    generation: int
    status: str
    reason: str
    detail: str


class InvalidPolicy(BaseModel):
    policy_id: str
    reason: str
    tenant_id: str | None = Field(description="The policy's tenant; none for a gateway policy")


class GatewayStatus(BaseModel):
    gateway_id: str
    desired_generation: int
    acknowledged_generation: int
    snapshot_version: str
    state: Literal["PENDING", "SYNCED", "FAILED"]
    last_report: LastReport | None
    invalid_policies: list[InvalidPolicy] = Field(
        default=[], description="Policies that would reach this gateway but are left out: invalid"
    )


# -- policies -----------------------------------------------------------------------------------
# One config model per kind the site supports, each a subset of that kind's own rules
# (`stoa_translate.policies`), which still run on every write and give the stored normal form.
# How many entries a config's list (or map) may hold is a CP setting (`policy_max_<limit>`), enforced
# by the translator's count rule (a 422 naming the list and the setting); `/openapi.json` publishes
# the configured number in place of this mark (`stoa_cp.openapi`).
LIMIT = "x-stoa-limit"
MAX_TARGETS = 256  # the APIs one api-scoped policy names


def bounded(limit: str, **field: Any) -> Any:
    """A list field of a policy config whose length is bounded by the setting `policy_max_<limit>`."""
    return Field(json_schema_extra={LIMIT: limit}, **field)


Entries = bounded("entries", default=[])
Origin = Annotated[str, StringConstraints(max_length=MAX_TEXT), syntax.ORIGIN]
HeaderName = Annotated[str, StringConstraints(max_length=MAX_TEXT), syntax.HEADER_NAME]
IpNetwork = Annotated[str, StringConstraints(max_length=MAX_TEXT), syntax.IP_NETWORK]
Count = whole(1, MAX_UINT32)

_NO_CREDENTIALS_WITH_ANY_ORIGIN = {
    "not": {
        "required": ["allowCredentials", "allowedOrigins"],
        "properties": {"allowCredentials": {"const": True}, "allowedOrigins": {"contains": {"const": "*"}}},
    }
}


class CorsConfig(Strict):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_NO_CREDENTIALS_WITH_ANY_ORIGIN)

    allowedOrigins: list[Origin] = bounded("origins", min_length=1)
    allowedMethods: list[MethodName] = Entries
    allowedHeaders: list[HeaderName] = bounded("headers", default=[])
    exposeHeaders: list[HeaderName] = bounded("headers", default=[])
    maxAge: whole(0, MAX_UINT32) | None = None
    allowCredentials: StrictBool = False

    @field_validator("allowCredentials")
    @classmethod
    def _credentials(cls, value: bool, info: ValidationInfo) -> bool:
        if value and "*" in info.data.get("allowedOrigins", []):
            raise ValueError("cannot be true when allowedOrigins contains '*'")
        return value


class RateLimitConfig(Strict):
    maxRequests: Count
    intervalSeconds: Count


class IpFilterConfig(Strict):
    mode: Literal["allow", "deny"]
    ip_list: list[IpNetwork] = bounded("addresses", min_length=1)


PiiKind = Literal["email", "card", "iban", "phone"]
# Text without control characters (a pattern's RE2 syntax is the kind's rule, a 422 naming it).
Pattern = Annotated[str, StringConstraints(max_length=MAX_TEXT), syntax.TEXT]


class PiiRule(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "if": {"required": ["action"]},
            "then": {"required": ["kinds"], "properties": {"kinds": {"minItems": 1}}},
        },
    )

    kinds: list[PiiKind] = Field(default=[], max_length=4, json_schema_extra={"uniqueItems": True})
    action: Literal["block", "redact"] = Field(default=None, json_schema_extra=_no_default)  # type: ignore[assignment]

    @field_validator("kinds")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("must be distinct")
        return value

    @field_validator("action")
    @classmethod
    def _with_kinds(cls, value: str, info: ValidationInfo) -> str:
        if not info.data.get("kinds"):
            raise ValueError("needs pii.kinds (at least one kind)")
        return value


class GuardrailsConfig(Strict):
    model_config = ConfigDict(
        extra="forbid",
        # At least one rule: a pattern, a PII kind, a JSON Schema or a size bound.
        json_schema_extra={
            "anyOf": [
                {"required": ["blockPatterns"], "properties": {"blockPatterns": {"minItems": 1}}},
                {
                    "required": ["pii"],
                    "properties": {"pii": {"required": ["kinds"], "properties": {"kinds": {"minItems": 1}}}},
                },
                {"required": ["jsonSchema"]},
                {"required": ["maxBodyBytes"], "properties": {"maxBodyBytes": {"minimum": 1}}},
            ]
        },
    )

    direction: Literal["request", "response", "both"] = "request"
    maxBodyBytes: whole(0, MAX_UINT32) = 0
    blockPatterns: list[Pattern] = bounded("patterns", default=[])
    pii: PiiRule = Field(default=None, json_schema_extra=_no_default)  # type: ignore[assignment]
    # A JSON Schema (its validity is the kind's rule, a 422 naming it).
    jsonSchema: JsonObject = Field(default=None, json_schema_extra=_no_default)  # type: ignore[assignment]

    @model_validator(mode="after")
    def _some_rule(self) -> GuardrailsConfig:
        if not (self.blockPatterns or (self.pii and self.pii.kinds) or self.jsonSchema or self.maxBodyBytes):
            raise ValueError("needs blockPatterns, pii, jsonSchema or maxBodyBytes")
        return self


def _json_value(value: Any) -> Any:
    """Any JSON value the inventory carries as given (its numbers are doubles: within ±2^53)."""
    found = unstorable(value, "")
    if found is None:
        found = _beyond_double(value, "")
    if found:
        where, why = found
        raise ValueError(f"{why} (at {where.lstrip('.')})" if where else why)
    return value


def _beyond_double(value: object, where: str) -> tuple[str, str] | None:
    if isinstance(value, float) and abs(value) > MAX_JSON_INTEGER:
        return where, f"must be a number within ±{MAX_JSON_INTEGER}"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        found = _beyond_double(item, f"{where}.{key}" if isinstance(key, str) else f"{where}[{key}]")
        if found:
            return found
    return None


NoNul = Annotated[str, WithJsonSchema({"type": "string", "not": {"pattern": "\\u0000"}})]
JsonNumber = Annotated[float, Field(ge=-MAX_JSON_INTEGER, le=MAX_JSON_INTEGER)]
# Only the published shape: `_json_value` checks it (one error naming the place, not one per branch).
JsonValueShape = TypeAliasType(
    "JsonValue",
    Union[StrictBool, JsonNumber, NoNul, list["JsonValueShape"], dict[NoNul, "JsonValueShape"], None],  # noqa: UP007
)
JsonValue = Annotated[Any, PlainValidator(_json_value, json_schema_input_type=JsonValueShape)]

# A header a transform may set or remove: a lower-case name, never the request line, framing, or the
# identity the gateway vouches for (the kind's rule, `stoa_translate.policies.transform`).
_EDITABLE_HEADER: dict[str, Any] = {
    "type": "string",
    "maxLength": MAX_TEXT,
    "pattern": syntax.LOWER_HEADER_NAME.pattern,
    "not": {"anyOf": [{"enum": ["host", "content-length", "transfer-encoding"]}, {"pattern": "^x-stoa-"}]},
}
EditableHeader = Annotated[
    str,
    StringConstraints(max_length=MAX_TEXT),
    syntax.LOWER_HEADER_NAME,
    WithJsonSchema(_EDITABLE_HEADER),
]
HeaderValue = Annotated[str, StringConstraints(max_length=MAX_TEXT), syntax.PRINTABLE]
HeadersSet = Annotated[
    dict[EditableHeader, HeaderValue],
    WithJsonSchema(
        {
            "type": "object",
            LIMIT: "entries",
            "propertyNames": _EDITABLE_HEADER,
            "additionalProperties": {
                "type": "string",
                "maxLength": MAX_TEXT,
                "pattern": syntax.PRINTABLE.pattern,
            },
        }
    ),
]
Pointer = Annotated[str, StringConstraints(max_length=MAX_TEXT), syntax.JSON_POINTER]


class HeaderEdits(Strict):
    set: HeadersSet = Field(default={}, description="Header name → value, set (replacing any)")
    remove: list[EditableHeader] = Entries


class JsonEdit(Strict):
    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "allOf": [
                {
                    "if": {"properties": {"op": {"const": "set"}}},
                    "then": {"required": ["value"], "properties": {"value": {"not": {"type": "null"}}}},
                },
                {"if": {"properties": {"op": {"const": "rename"}}}, "then": {"required": ["to"]}},
            ]
        },
    )

    op: Literal["set", "remove", "rename"]
    path: Pointer
    value: JsonValue = Field(default=None, description="The value `set` writes (required for set)")
    to: Pointer = Field(  # type: ignore[assignment]
        default=None,
        description="Where `rename` moves the value (required for rename)",
        json_schema_extra=_no_default,
    )


class TransformSide(Strict):
    headers: HeaderEdits = Field(default=None, json_schema_extra=_no_default)  # type: ignore[assignment]
    json_edits: list[JsonEdit] = bounded("entries", default=[], alias="json")


_EDITS = {
    "anyOf": [
        {
            "required": ["headers"],
            "properties": {
                "headers": {
                    "anyOf": [
                        {"required": ["set"], "properties": {"set": {"minProperties": 1}}},
                        {"required": ["remove"], "properties": {"remove": {"minItems": 1}}},
                    ]
                }
            },
        },
        {"required": ["json"], "properties": {"json": {"minItems": 1}}},
    ]
}


class TransformConfig(Strict):
    model_config = ConfigDict(
        extra="forbid",
        # At least one edit, on the request or on the response.
        json_schema_extra={
            "anyOf": [
                {"required": ["request"], "properties": {"request": _EDITS}},
                {"required": ["response"], "properties": {"response": _EDITS}},
            ]
        },
    )

    request: TransformSide = Field(default=None, json_schema_extra=_no_default)  # type: ignore[assignment]
    response: TransformSide = Field(default=None, json_schema_extra=_no_default)  # type: ignore[assignment]


class CorsPolicy(Strict):
    type: Literal["cors"]
    config: CorsConfig


class RateLimitPolicy(Strict):
    type: Literal["rate_limit"]
    config: RateLimitConfig


class IpFilterPolicy(Strict):
    type: Literal["ip_filter"]
    config: IpFilterConfig


class GuardrailsPolicy(Strict):
    type: Literal["guardrails"]
    config: GuardrailsConfig


class TransformPolicy(Strict):
    type: Literal["transform"]
    config: TransformConfig


class OpaConfig(Strict):
    # Whether the text is a Rego v1 module that compiles is the kind's rule (a 422 naming it).
    module: str = Field(min_length=1, max_length=MAX_DOCUMENT, description="A Rego v1 module")
    entrypoint: Annotated[str, StringConstraints(max_length=MAX_TEXT), syntax.REGO_RULE] = Field(
        default="data.stoa.allow", description="The rule whose value decides: allowed only when exactly true"
    )


class OpaPolicy(Strict):
    type: Literal["opa"]
    config: OpaConfig


class CompressionConfig(Strict):
    # Each algorithm once (a repeat is the kind's rule, a 422 naming it); stored in one order.
    algorithms: list[Literal["gzip", "br", "zstd"]] = Field(
        min_length=1, max_length=3, json_schema_extra={"uniqueItems": True}
    )
    minBytes: whole(0, MAX_UINT32) = Field(
        default=0, description="Shorter responses are not compressed (0: Envoy's default, 30)"
    )


class CompressionPolicy(Strict):
    type: Literal["compression"]
    config: CompressionConfig


class TokenBudgetConfig(Strict):
    tokens: Count = Field(description="Tokens (usage.total_tokens) per window")
    windowSeconds: Count
    billed: StrictBool = Field(default=False, description="No count, no access: fail closed")
    per: Literal["consumer", "tenant"]
    # At most `tokens` (the kind's rule, a 422 naming it: such a reservation never fits).
    defaultMaxTokens: whole(0, MAX_UINT32) = Field(
        default=0,
        description="Reserved for a request naming no max_tokens (0: 1024, or tokens when smaller)",
    )


class TokenBudgetPolicy(Strict):
    type: Literal["token_budget"]
    config: TokenBudgetConfig


# The kinds the translator supports (`stoa_translate.policies.SUPPORTED_KINDS`), in its order.
KINDS: tuple[type[BaseModel], ...] = (
    CorsPolicy,
    RateLimitPolicy,
    IpFilterPolicy,
    GuardrailsPolicy,
    TransformPolicy,
    OpaPolicy,
    CompressionPolicy,
    TokenBudgetPolicy,
)


class TenantPlacement(Strict):
    model_config = ConfigDict(
        extra="forbid",
        # A tenant policy applies to every route of the tenant: it names no targets.
        json_schema_extra={
            "if": {"required": ["scope"], "properties": {"scope": {"const": "tenant"}}},
            "then": {"properties": {"targets": {"maxItems": 0}}},
        },
    )

    scope: Literal["tenant", "api"]
    targets: list[Identifier] = Field(default=[], max_length=MAX_TARGETS)

    @field_validator("targets")
    @classmethod
    def _targets(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if info.data.get("scope") == "tenant" and value:
            raise ValueError("must be empty for scope 'tenant' (it applies to every route of the tenant)")
        return value


class Named(Strict):
    policy_id: Identifier


def _bodies(name: str, *bases: type[BaseModel]) -> Any:
    """The request body: one model per kind (with `bases`), told apart by `type`."""
    members = tuple(
        create_model(f"{kind.__name__.removesuffix('Policy')}{name}", __base__=(kind, *bases))
        for kind in KINDS
    )
    return Annotated[Union[members], Field(discriminator="type")]  # noqa: UP007 - a tuple of members


TenantPolicyBody = _bodies("TenantPolicy", TenantPlacement, Named)
TenantPolicyPut = _bodies("TenantPolicyUpdate", TenantPlacement)
GatewayPolicyBody = _bodies("GatewayPolicy", Named)
GatewayPolicyPut = _bodies("GatewayPolicyUpdate")


# What the store keeps: the config as the site's rules normalised it.
class TenantPolicyFields(BaseModel):
    type: str
    config: dict[str, Any]
    scope: Literal["tenant", "api"]
    targets: list[str] = []


class TenantPolicyIn(TenantPolicyFields):
    policy_id: str


class GatewayPolicyFields(BaseModel):
    type: str
    config: dict[str, Any]


class GatewayPolicyIn(GatewayPolicyFields):
    policy_id: str


class PolicyOut(BaseModel):
    policy_id: str
    type: str
    config: dict[str, Any]
    scope: str
    targets: list[str]
    tenant_id: str | None
    gateway_id: str | None
    invalid_reason: str | None = Field(
        default=None,
        description="Set when a policy stored before the current rules is refused by them: it is kept,"
        " left out of every inventory, and a PUT with a valid config clears it",
    )


# -- issuers ------------------------------------------------------------------------------------
def _key_set(schema: dict[str, Any]) -> None:
    _no_default(schema)
    schema.update(_JWKS_SCHEMA)


# What a schema can say of a key set; the rest (public keys only, usable key material, unique kids)
# is `stoa_translate.jwks`'s rule, a 422 naming the member.
_JWKS_SCHEMA: dict[str, Any] = {
    "required": ["keys"],
    "properties": {
        "keys": {"type": "array", "minItems": 1, "maxItems": MAX_KEYS, "items": {"type": "object"}}
    },
}


class IssuerIn(Strict):
    """Exactly one of `jwks_uri` (fetched now) or `jwks` (the key set itself)."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"oneOf": [{"required": ["jwks_uri"]}, {"required": ["jwks"]}]}
    )

    issuer: HttpUrl
    jwks_uri: HttpUrl = Field(default=None, json_schema_extra=_no_default)  # type: ignore[assignment]
    jwks: JsonObject = Field(default=None, json_schema_extra=_key_set)  # type: ignore[assignment]


class IssuerOut(BaseModel):
    issuer_id: str
    tenant_id: str
    issuer: str
    jwks_uri: str | None
    jwks: dict[str, Any]
    fetched_at: datetime | None = Field(description="When keys were last fetched and adopted")
    last_fetched_at: datetime | None = Field(description="The same as fetched_at")
    last_error: str
    stale: bool = Field(
        description="No fetch adopted for longer than the stale bound: the keys are out of every "
        "inventory and the issuer's tokens are refused until a fetch succeeds"
    )

    @classmethod
    def of(cls, row: Any) -> IssuerOut:
        """From a stored row (`last_fetched_at` is `fetched_at`)."""
        return cls(**{**dict(row), "last_fetched_at": row["fetched_at"]})


class IssuerRefreshed(IssuerOut):
    changed: bool


# -- consumers, API keys, plans, subscriptions ---------------------------------------------------
ClientId = Annotated[str, StringConstraints(min_length=1, max_length=255), syntax.VISIBLE]


def _unique(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("must not repeat a value")
    return values


class ConsumerFields(Strict):
    name: Name
    # OAuth client ids whose tokens act for this consumer (matched on `azp`, else `client_id`).
    client_ids: Annotated[
        list[ClientId], Field(max_length=64, json_schema_extra={"uniqueItems": True}), AfterValidator(_unique)
    ] = []


class ConsumerIn(ConsumerFields):
    consumer_id: Identifier


class ConsumerUpdate(ConsumerFields):
    """A PUT names its consumer in the path only."""


class ConsumerOut(BaseModel):
    consumer_id: str
    tenant_id: str
    name: str
    client_ids: list[str]


class KeyOut(BaseModel):
    key_id: str
    consumer_id: str
    prefix: str = Field(description="Public: identifies the key in listings and logs")
    created_at: datetime
    revoked_at: datetime | None


class KeyCreated(BaseModel):
    key_id: str
    consumer_id: str
    prefix: str
    key: str = Field(description="Shown once; the CP stores only its SHA-256 digest")
    created_at: datetime


class PlanFields(Strict):
    requests: int = Field(ge=1, le=1_000_000_000)
    window_seconds: int = Field(ge=1, le=31_536_000)
    # Billed: counted exactly, one atomic update per request, denied when the count cannot be made.
    billed: StrictBool = False


class PlanIn(PlanFields):
    plan_id: Identifier


class PlanUpdate(PlanFields):
    """A PUT names its plan in the path only."""


class PlanOut(PlanFields):
    plan_id: str
    tenant_id: str


class SubscriptionIn(Strict):
    subscription_id: Identifier
    consumer_id: Identifier
    api_id: Identifier
    plan_id: Identifier


class SubscriptionUpdate(Strict):
    state: Literal["active", "suspended"]


class SubscriptionOut(BaseModel):
    subscription_id: str
    tenant_id: str
    consumer_id: str
    api_id: str
    plan_id: str
    state: str


# -- audit --------------------------------------------------------------------------------------
class AuditEntry(BaseModel):
    id: int
    at: datetime
    subject: str
    role: str
    actor_tenant: str | None = Field(description="The tenant the caller is confined to, if any")
    issuer: str = Field(description="The token's issuer, or `static-admin-token`")
    method: str
    path: str
    status: int = Field(description="The HTTP status the write was answered with")
    tenant_id: str | None = Field(description="The tenant whose object was written (none: platform)")
    object_ids: dict[str, str]
    generations: dict[str, int] = Field(description="Gateway id → the generation this write produced")


# -- translation preview --------------------------------------------------------------------------
class PreviewRefusal(BaseModel):
    reason: str = Field(description="The FailureReason the Link would report")
    detail: str


class PreviewValidation(BaseModel):
    valid: bool
    detail: str = Field(description="Envoy's own words when it refuses the configuration")


class Preview(BaseModel):
    gateway_id: str
    generation: int = Field(description="The desired generation previewed")
    settings: dict[str, Any] = Field(description="The translation settings used (TranslateSettings)")
    settings_reported: bool = Field(
        description="True: the settings the gateway's Link last reported; false: the documented defaults"
    )
    tenant_id: str | None = Field(
        default=None,
        description="Set for a tenant-bound caller: the preview is of that tenant's part of the gateway"
        " (its routes, its issuers, the policies as they apply to its routes)",
    )
    snapshot_version: str | None = Field(
        default=None,
        description="The content hash the Link would report with SYNCED (the whole gateway's only)",
    )
    resources: dict[str, list[dict[str, Any]]] = Field(
        default={}, description="Envoy's resources by type URL, proto3 JSON"
    )
    policy_sets: dict[str, list[dict[str, Any]]] = Field(
        default={}, description="The site services' policy sets by type URL, proto3 JSON"
    )
    refusal: PreviewRefusal | None = Field(default=None, description="Set when the Link would refuse")
    validation: PreviewValidation | None = Field(default=None, description="With ?validate=envoy")
