from stoa_proto import mcp_pb2 as _mcp_pb2
from stoa_proto import proc_pb2 as _proc_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SyncStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SYNC_STATUS_UNSPECIFIED: _ClassVar[SyncStatus]
    SYNCED: _ClassVar[SyncStatus]
    FAILED: _ClassVar[SyncStatus]

class FailureReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FAILURE_REASON_UNSPECIFIED: _ClassVar[FailureReason]
    FOREIGN_GATEWAY: _ClassVar[FailureReason]
    STALE_GENERATION: _ClassVar[FailureReason]
    ROUTE_LOSS: _ClassVar[FailureReason]
    UNSUPPORTED_POLICY: _ClassVar[FailureReason]
    DUPLICATE_POLICY: _ClassVar[FailureReason]
    INVALID_INVENTORY: _ClassVar[FailureReason]
    NACK: _ClassVar[FailureReason]
    ACK_TIMEOUT: _ClassVar[FailureReason]
    INCONSISTENT_SNAPSHOT: _ClassVar[FailureReason]
SYNC_STATUS_UNSPECIFIED: SyncStatus
SYNCED: SyncStatus
FAILED: SyncStatus
FAILURE_REASON_UNSPECIFIED: FailureReason
FOREIGN_GATEWAY: FailureReason
STALE_GENERATION: FailureReason
ROUTE_LOSS: FailureReason
UNSUPPORTED_POLICY: FailureReason
DUPLICATE_POLICY: FailureReason
INVALID_INVENTORY: FailureReason
NACK: FailureReason
ACK_TIMEOUT: FailureReason
INCONSISTENT_SNAPSHOT: FailureReason

class Route(_message.Message):
    __slots__ = ("route_id", "tenant_id", "api_id", "path_prefix", "methods", "upstream_url", "timeout_ms", "auth_mode", "scopes", "forward_credential", "envelope", "kind", "key_header", "subscription")
    ROUTE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    API_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_PREFIX_FIELD_NUMBER: _ClassVar[int]
    METHODS_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_URL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    AUTH_MODE_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    FORWARD_CREDENTIAL_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    KEY_HEADER_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    route_id: str
    tenant_id: str
    api_id: str
    path_prefix: str
    methods: _containers.RepeatedScalarFieldContainer[str]
    upstream_url: str
    timeout_ms: int
    auth_mode: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    forward_credential: bool
    envelope: bool
    kind: str
    key_header: str
    subscription: bool
    def __init__(self, route_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., api_id: _Optional[str] = ..., path_prefix: _Optional[str] = ..., methods: _Optional[_Iterable[str]] = ..., upstream_url: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., auth_mode: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., forward_credential: _Optional[bool] = ..., envelope: _Optional[bool] = ..., kind: _Optional[str] = ..., key_header: _Optional[str] = ..., subscription: _Optional[bool] = ...) -> None: ...

class Consumer(_message.Message):
    __slots__ = ("tenant_id", "consumer_id", "client_ids", "key_sha256")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_IDS_FIELD_NUMBER: _ClassVar[int]
    KEY_SHA256_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    consumer_id: str
    client_ids: _containers.RepeatedScalarFieldContainer[str]
    key_sha256: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, tenant_id: _Optional[str] = ..., consumer_id: _Optional[str] = ..., client_ids: _Optional[_Iterable[str]] = ..., key_sha256: _Optional[_Iterable[str]] = ...) -> None: ...

class Subscription(_message.Message):
    __slots__ = ("tenant_id", "subscription_id", "consumer_id", "api_id", "plan_id", "active", "requests", "window_seconds", "billed")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_ID_FIELD_NUMBER: _ClassVar[int]
    API_ID_FIELD_NUMBER: _ClassVar[int]
    PLAN_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BILLED_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    subscription_id: str
    consumer_id: str
    api_id: str
    plan_id: str
    active: bool
    requests: int
    window_seconds: int
    billed: bool
    def __init__(self, tenant_id: _Optional[str] = ..., subscription_id: _Optional[str] = ..., consumer_id: _Optional[str] = ..., api_id: _Optional[str] = ..., plan_id: _Optional[str] = ..., active: _Optional[bool] = ..., requests: _Optional[int] = ..., window_seconds: _Optional[int] = ..., billed: _Optional[bool] = ...) -> None: ...

class Policy(_message.Message):
    __slots__ = ("policy_id", "type", "scope", "targets", "tenant_id", "applicable", "cors", "rate_limit", "ip_filter", "compression", "guardrails", "transform", "token_budget", "opa")
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SCOPE_FIELD_NUMBER: _ClassVar[int]
    TARGETS_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    APPLICABLE_FIELD_NUMBER: _ClassVar[int]
    CORS_FIELD_NUMBER: _ClassVar[int]
    RATE_LIMIT_FIELD_NUMBER: _ClassVar[int]
    IP_FILTER_FIELD_NUMBER: _ClassVar[int]
    COMPRESSION_FIELD_NUMBER: _ClassVar[int]
    GUARDRAILS_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    OPA_FIELD_NUMBER: _ClassVar[int]
    policy_id: str
    type: str
    scope: str
    targets: _containers.RepeatedScalarFieldContainer[str]
    tenant_id: str
    applicable: _containers.RepeatedScalarFieldContainer[str]
    cors: CorsPolicy
    rate_limit: RateLimitPolicy
    ip_filter: IpFilterPolicy
    compression: CompressionPolicy
    guardrails: _proc_pb2.Guardrails
    transform: _proc_pb2.Transform
    token_budget: _proc_pb2.TokenBudget
    opa: OpaPolicy
    def __init__(self, policy_id: _Optional[str] = ..., type: _Optional[str] = ..., scope: _Optional[str] = ..., targets: _Optional[_Iterable[str]] = ..., tenant_id: _Optional[str] = ..., applicable: _Optional[_Iterable[str]] = ..., cors: _Optional[_Union[CorsPolicy, _Mapping]] = ..., rate_limit: _Optional[_Union[RateLimitPolicy, _Mapping]] = ..., ip_filter: _Optional[_Union[IpFilterPolicy, _Mapping]] = ..., compression: _Optional[_Union[CompressionPolicy, _Mapping]] = ..., guardrails: _Optional[_Union[_proc_pb2.Guardrails, _Mapping]] = ..., transform: _Optional[_Union[_proc_pb2.Transform, _Mapping]] = ..., token_budget: _Optional[_Union[_proc_pb2.TokenBudget, _Mapping]] = ..., opa: _Optional[_Union[OpaPolicy, _Mapping]] = ...) -> None: ...

class CorsPolicy(_message.Message):
    __slots__ = ("allowed_origins", "allowed_methods", "allowed_headers", "expose_headers", "max_age", "allow_credentials")
    ALLOWED_ORIGINS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_METHODS_FIELD_NUMBER: _ClassVar[int]
    ALLOWED_HEADERS_FIELD_NUMBER: _ClassVar[int]
    EXPOSE_HEADERS_FIELD_NUMBER: _ClassVar[int]
    MAX_AGE_FIELD_NUMBER: _ClassVar[int]
    ALLOW_CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    allowed_origins: _containers.RepeatedScalarFieldContainer[str]
    allowed_methods: _containers.RepeatedScalarFieldContainer[str]
    allowed_headers: _containers.RepeatedScalarFieldContainer[str]
    expose_headers: _containers.RepeatedScalarFieldContainer[str]
    max_age: int
    allow_credentials: bool
    def __init__(self, allowed_origins: _Optional[_Iterable[str]] = ..., allowed_methods: _Optional[_Iterable[str]] = ..., allowed_headers: _Optional[_Iterable[str]] = ..., expose_headers: _Optional[_Iterable[str]] = ..., max_age: _Optional[int] = ..., allow_credentials: _Optional[bool] = ...) -> None: ...

class OpaPolicy(_message.Message):
    __slots__ = ("module", "entrypoint")
    MODULE_FIELD_NUMBER: _ClassVar[int]
    ENTRYPOINT_FIELD_NUMBER: _ClassVar[int]
    module: str
    entrypoint: str
    def __init__(self, module: _Optional[str] = ..., entrypoint: _Optional[str] = ...) -> None: ...

class CompressionPolicy(_message.Message):
    __slots__ = ("algorithms", "min_bytes")
    ALGORITHMS_FIELD_NUMBER: _ClassVar[int]
    MIN_BYTES_FIELD_NUMBER: _ClassVar[int]
    algorithms: _containers.RepeatedScalarFieldContainer[str]
    min_bytes: int
    def __init__(self, algorithms: _Optional[_Iterable[str]] = ..., min_bytes: _Optional[int] = ...) -> None: ...

class RateLimitPolicy(_message.Message):
    __slots__ = ("max_requests", "interval_seconds")
    MAX_REQUESTS_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    max_requests: int
    interval_seconds: int
    def __init__(self, max_requests: _Optional[int] = ..., interval_seconds: _Optional[int] = ...) -> None: ...

class IpFilterPolicy(_message.Message):
    __slots__ = ("mode", "ip_list")
    MODE_FIELD_NUMBER: _ClassVar[int]
    IP_LIST_FIELD_NUMBER: _ClassVar[int]
    mode: str
    ip_list: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, mode: _Optional[str] = ..., ip_list: _Optional[_Iterable[str]] = ...) -> None: ...

class Tombstone(_message.Message):
    __slots__ = ("route_id", "generation")
    ROUTE_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    route_id: str
    generation: int
    def __init__(self, route_id: _Optional[str] = ..., generation: _Optional[int] = ...) -> None: ...

class TrustedIssuer(_message.Message):
    __slots__ = ("tenant_id", "issuer", "jwks_json", "jwks_uri")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    ISSUER_FIELD_NUMBER: _ClassVar[int]
    JWKS_JSON_FIELD_NUMBER: _ClassVar[int]
    JWKS_URI_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    issuer: str
    jwks_json: str
    jwks_uri: str
    def __init__(self, tenant_id: _Optional[str] = ..., issuer: _Optional[str] = ..., jwks_json: _Optional[str] = ..., jwks_uri: _Optional[str] = ...) -> None: ...

class Inventory(_message.Message):
    __slots__ = ("schema_version", "gateway_id", "generation", "routes", "policies", "tombstones", "issuers", "tools", "consumers", "subscriptions", "revoked_key_sha256")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    ISSUERS_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_KEY_SHA256_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    gateway_id: str
    generation: int
    routes: _containers.RepeatedCompositeFieldContainer[Route]
    policies: _containers.RepeatedCompositeFieldContainer[Policy]
    tombstones: _containers.RepeatedCompositeFieldContainer[Tombstone]
    issuers: _containers.RepeatedCompositeFieldContainer[TrustedIssuer]
    tools: _containers.RepeatedCompositeFieldContainer[_mcp_pb2.Tool]
    consumers: _containers.RepeatedCompositeFieldContainer[Consumer]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    revoked_key_sha256: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, schema_version: _Optional[int] = ..., gateway_id: _Optional[str] = ..., generation: _Optional[int] = ..., routes: _Optional[_Iterable[_Union[Route, _Mapping]]] = ..., policies: _Optional[_Iterable[_Union[Policy, _Mapping]]] = ..., tombstones: _Optional[_Iterable[_Union[Tombstone, _Mapping]]] = ..., issuers: _Optional[_Iterable[_Union[TrustedIssuer, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[_mcp_pb2.Tool, _Mapping]]] = ..., consumers: _Optional[_Iterable[_Union[Consumer, _Mapping]]] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., revoked_key_sha256: _Optional[_Iterable[str]] = ...) -> None: ...

class InventoryDelta(_message.Message):
    __slots__ = ("schema_version", "gateway_id", "generation", "base_generation", "routes", "policies", "tombstones", "issuers", "removed_routes", "removed_policies", "removed_tombstones", "removed_issuers", "inventory_hash", "tools", "removed_tools", "consumers", "subscriptions", "revoked_key_sha256", "removed_consumers", "removed_subscriptions", "removed_revoked_key_sha256")
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    BASE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    ISSUERS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_ROUTES_FIELD_NUMBER: _ClassVar[int]
    REMOVED_POLICIES_FIELD_NUMBER: _ClassVar[int]
    REMOVED_TOMBSTONES_FIELD_NUMBER: _ClassVar[int]
    REMOVED_ISSUERS_FIELD_NUMBER: _ClassVar[int]
    INVENTORY_HASH_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_KEY_SHA256_FIELD_NUMBER: _ClassVar[int]
    REMOVED_CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    REMOVED_REVOKED_KEY_SHA256_FIELD_NUMBER: _ClassVar[int]
    schema_version: int
    gateway_id: str
    generation: int
    base_generation: int
    routes: _containers.RepeatedCompositeFieldContainer[Route]
    policies: _containers.RepeatedCompositeFieldContainer[Policy]
    tombstones: _containers.RepeatedCompositeFieldContainer[Tombstone]
    issuers: _containers.RepeatedCompositeFieldContainer[TrustedIssuer]
    removed_routes: _containers.RepeatedScalarFieldContainer[str]
    removed_policies: _containers.RepeatedScalarFieldContainer[str]
    removed_tombstones: _containers.RepeatedScalarFieldContainer[str]
    removed_issuers: _containers.RepeatedCompositeFieldContainer[TrustedIssuer]
    inventory_hash: str
    tools: _containers.RepeatedCompositeFieldContainer[_mcp_pb2.Tool]
    removed_tools: _containers.RepeatedCompositeFieldContainer[_mcp_pb2.Tool]
    consumers: _containers.RepeatedCompositeFieldContainer[Consumer]
    subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    revoked_key_sha256: _containers.RepeatedScalarFieldContainer[str]
    removed_consumers: _containers.RepeatedCompositeFieldContainer[Consumer]
    removed_subscriptions: _containers.RepeatedCompositeFieldContainer[Subscription]
    removed_revoked_key_sha256: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, schema_version: _Optional[int] = ..., gateway_id: _Optional[str] = ..., generation: _Optional[int] = ..., base_generation: _Optional[int] = ..., routes: _Optional[_Iterable[_Union[Route, _Mapping]]] = ..., policies: _Optional[_Iterable[_Union[Policy, _Mapping]]] = ..., tombstones: _Optional[_Iterable[_Union[Tombstone, _Mapping]]] = ..., issuers: _Optional[_Iterable[_Union[TrustedIssuer, _Mapping]]] = ..., removed_routes: _Optional[_Iterable[str]] = ..., removed_policies: _Optional[_Iterable[str]] = ..., removed_tombstones: _Optional[_Iterable[str]] = ..., removed_issuers: _Optional[_Iterable[_Union[TrustedIssuer, _Mapping]]] = ..., inventory_hash: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[_mcp_pb2.Tool, _Mapping]]] = ..., removed_tools: _Optional[_Iterable[_Union[_mcp_pb2.Tool, _Mapping]]] = ..., consumers: _Optional[_Iterable[_Union[Consumer, _Mapping]]] = ..., subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., revoked_key_sha256: _Optional[_Iterable[str]] = ..., removed_consumers: _Optional[_Iterable[_Union[Consumer, _Mapping]]] = ..., removed_subscriptions: _Optional[_Iterable[_Union[Subscription, _Mapping]]] = ..., removed_revoked_key_sha256: _Optional[_Iterable[str]] = ...) -> None: ...

class SyncReport(_message.Message):
    __slots__ = ("gateway_id", "generation", "status", "snapshot_version", "reason", "detail", "settings")
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_VERSION_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    SETTINGS_FIELD_NUMBER: _ClassVar[int]
    gateway_id: str
    generation: int
    status: SyncStatus
    snapshot_version: str
    reason: FailureReason
    detail: str
    settings: TranslateSettings
    def __init__(self, gateway_id: _Optional[str] = ..., generation: _Optional[int] = ..., status: _Optional[_Union[SyncStatus, str]] = ..., snapshot_version: _Optional[str] = ..., reason: _Optional[_Union[FailureReason, str]] = ..., detail: _Optional[str] = ..., settings: _Optional[_Union[TranslateSettings, _Mapping]] = ...) -> None: ...

class TranslateSettings(_message.Message):
    __slots__ = ("listener_address", "listener_port", "ext_authz_address", "ext_authz_timeout_ms", "ext_proc_address", "decision_placement", "audience", "required_scopes", "tenant_claim", "max_token_lifetime_s", "decision_log_cluster", "mcp_address", "default_route_timeout_ms", "xff_num_trusted_hops", "extra_identity_headers", "route_scopes")
    LISTENER_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LISTENER_PORT_FIELD_NUMBER: _ClassVar[int]
    EXT_AUTHZ_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    EXT_AUTHZ_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    EXT_PROC_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DECISION_PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    AUDIENCE_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_SCOPES_FIELD_NUMBER: _ClassVar[int]
    TENANT_CLAIM_FIELD_NUMBER: _ClassVar[int]
    MAX_TOKEN_LIFETIME_S_FIELD_NUMBER: _ClassVar[int]
    DECISION_LOG_CLUSTER_FIELD_NUMBER: _ClassVar[int]
    MCP_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ROUTE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    XFF_NUM_TRUSTED_HOPS_FIELD_NUMBER: _ClassVar[int]
    EXTRA_IDENTITY_HEADERS_FIELD_NUMBER: _ClassVar[int]
    ROUTE_SCOPES_FIELD_NUMBER: _ClassVar[int]
    listener_address: str
    listener_port: int
    ext_authz_address: str
    ext_authz_timeout_ms: int
    ext_proc_address: str
    decision_placement: str
    audience: str
    required_scopes: _containers.RepeatedScalarFieldContainer[str]
    tenant_claim: str
    max_token_lifetime_s: int
    decision_log_cluster: str
    mcp_address: str
    default_route_timeout_ms: int
    xff_num_trusted_hops: int
    extra_identity_headers: _containers.RepeatedScalarFieldContainer[str]
    route_scopes: bool
    def __init__(self, listener_address: _Optional[str] = ..., listener_port: _Optional[int] = ..., ext_authz_address: _Optional[str] = ..., ext_authz_timeout_ms: _Optional[int] = ..., ext_proc_address: _Optional[str] = ..., decision_placement: _Optional[str] = ..., audience: _Optional[str] = ..., required_scopes: _Optional[_Iterable[str]] = ..., tenant_claim: _Optional[str] = ..., max_token_lifetime_s: _Optional[int] = ..., decision_log_cluster: _Optional[str] = ..., mcp_address: _Optional[str] = ..., default_route_timeout_ms: _Optional[int] = ..., xff_num_trusted_hops: _Optional[int] = ..., extra_identity_headers: _Optional[_Iterable[str]] = ..., route_scopes: _Optional[bool] = ...) -> None: ...
