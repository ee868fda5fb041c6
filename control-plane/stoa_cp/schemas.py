"""Request and response bodies of the CP API (validation lives with the field it guards)."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    StringConstraints,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import InitErrorDetails
from stoa_translate import fields
from stoa_translate import tools as tool_rules

ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
Identifier = Annotated[str, StringConstraints(pattern=ID_PATTERN)]
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
    fields.path(value)
    return value


def _http_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("must be an http:// or https:// URL")
    # Credentials in a URL would be stored, shown and echoed in errors: never accepted.
    if parts.username is not None or parts.password is not None:
        raise ValueError("must not carry credentials")
    return value


Name = Annotated[
    str, StringConstraints(min_length=1, max_length=200, strip_whitespace=True), AfterValidator(_storable)
]
JsonObject = Annotated[dict[str, Any], AfterValidator(_storable)]
UpstreamUrl = Annotated[str, StringConstraints(max_length=MAX_URL_LENGTH), AfterValidator(_upstream_url)]
PathPrefix = Annotated[str, StringConstraints(max_length=MAX_URL_LENGTH), AfterValidator(_path_prefix)]
Methods = Annotated[list[str], Field(min_length=1), AfterValidator(fields.methods)]
Scopes = Annotated[list[str], AfterValidator(fields.scopes)]
PolicyType = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
HttpUrl = Annotated[
    str, StringConstraints(max_length=MAX_URL_LENGTH), AfterValidator(_storable), AfterValidator(_http_url)
]


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
    mode: Literal["jwt", "none", "api_key"] = "jwt"
    scopes: Scopes = []
    # The upstream also gets the client's credential (by default it is removed once checked).
    forward_credential: bool = False
    # The upstream gets the signed identity envelope; the authorization service then decides the API.
    envelope: bool = False

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
    name: Name
    # "http": proxied to upstream_url; "mcp": an MCP route answered by the site's MCP module with the
    # tools of the API's tenant (no upstream_url; identity from the signed envelope, so always a token).
    kind: Literal["http", "mcp"] = "http"
    upstream_url: UpstreamUrl | None = None
    path_prefix: PathPrefix | None = None
    methods: Methods
    timeout_ms: int | None = Field(default=None, ge=1, le=3_600_000)
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
    """PUT replaces every field; `api_id`, when given, must equal the path's."""

    api_id: Identifier | None = None


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


ToolName = Annotated[str, AfterValidator(_rule(tool_rules.name))]


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
    """PUT replaces every field; `name`, when given, must equal the path's."""

    name: ToolName | None = None


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
    grant_id: Identifier
    tool: ToolName
    consumers: list[
        Annotated[str, StringConstraints(min_length=1, max_length=256), AfterValidator(_storable)]
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
class TenantPolicyFields(Strict):
    type: PolicyType
    config: JsonObject
    scope: Literal["tenant", "api"]
    targets: list[Identifier] = []


class TenantPolicyIn(TenantPolicyFields):
    policy_id: Identifier


class TenantPolicyUpdate(TenantPolicyFields):
    policy_id: Identifier | None = None


class GatewayPolicyFields(Strict):
    type: PolicyType
    config: JsonObject


class GatewayPolicyIn(GatewayPolicyFields):
    policy_id: Identifier


class GatewayPolicyUpdate(GatewayPolicyFields):
    policy_id: Identifier | None = None


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
class IssuerIn(Strict):
    issuer: HttpUrl
    jwks_uri: HttpUrl | None = None
    jwks: JsonObject | None = None


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
ClientId = Annotated[str, StringConstraints(min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$")]


def _unique(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("must not repeat a value")
    return values


class ConsumerFields(Strict):
    name: Name
    # OAuth client ids whose tokens act for this consumer (matched on `azp`, else `client_id`).
    client_ids: Annotated[list[ClientId], Field(max_length=64), AfterValidator(_unique)] = []


class ConsumerIn(ConsumerFields):
    consumer_id: Identifier


class ConsumerUpdate(ConsumerFields):
    consumer_id: Identifier | None = None


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
    billed: bool = False


class PlanIn(PlanFields):
    plan_id: Identifier


class PlanUpdate(PlanFields):
    plan_id: Identifier | None = None


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
    snapshot_version: str | None = Field(
        default=None, description="The content hash the Link would report with SYNCED"
    )
    resources: dict[str, list[dict[str, Any]]] = Field(
        default={}, description="Envoy's resources by type URL, proto3 JSON"
    )
    policy_sets: dict[str, list[dict[str, Any]]] = Field(
        default={}, description="The site services' policy sets by type URL, proto3 JSON"
    )
    refusal: PreviewRefusal | None = Field(default=None, description="Set when the Link would refuse")
    validation: PreviewValidation | None = Field(default=None, description="With ?validate=envoy")
