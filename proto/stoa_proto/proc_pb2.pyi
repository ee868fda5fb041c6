from google.protobuf import struct_pb2 as _struct_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class PiiRule(_message.Message):
    __slots__ = ("kinds", "action")
    KINDS_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    action: str
    def __init__(self, kinds: _Optional[_Iterable[str]] = ..., action: _Optional[str] = ...) -> None: ...

class Guardrails(_message.Message):
    __slots__ = ("direction", "max_body_bytes", "block_patterns", "pii", "json_schema")
    DIRECTION_FIELD_NUMBER: _ClassVar[int]
    MAX_BODY_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_PATTERNS_FIELD_NUMBER: _ClassVar[int]
    PII_FIELD_NUMBER: _ClassVar[int]
    JSON_SCHEMA_FIELD_NUMBER: _ClassVar[int]
    direction: str
    max_body_bytes: int
    block_patterns: _containers.RepeatedScalarFieldContainer[str]
    pii: PiiRule
    json_schema: _struct_pb2.Struct
    def __init__(self, direction: _Optional[str] = ..., max_body_bytes: _Optional[int] = ..., block_patterns: _Optional[_Iterable[str]] = ..., pii: _Optional[_Union[PiiRule, _Mapping]] = ..., json_schema: _Optional[_Union[_struct_pb2.Struct, _Mapping]] = ...) -> None: ...

class HeaderEdits(_message.Message):
    __slots__ = ("set", "remove")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    set: _containers.ScalarMap[str, str]
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, set: _Optional[_Mapping[str, str]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class JsonEdit(_message.Message):
    __slots__ = ("op", "path", "value", "to")
    OP_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    TO_FIELD_NUMBER: _ClassVar[int]
    op: str
    path: str
    value: _struct_pb2.Value
    to: str
    def __init__(self, op: _Optional[str] = ..., path: _Optional[str] = ..., value: _Optional[_Union[_struct_pb2.Value, _Mapping]] = ..., to: _Optional[str] = ...) -> None: ...

class TransformSide(_message.Message):
    __slots__ = ("headers", "json")
    HEADERS_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    headers: HeaderEdits
    json: _containers.RepeatedCompositeFieldContainer[JsonEdit]
    def __init__(self, headers: _Optional[_Union[HeaderEdits, _Mapping]] = ..., json: _Optional[_Iterable[_Union[JsonEdit, _Mapping]]] = ...) -> None: ...

class Transform(_message.Message):
    __slots__ = ("request", "response")
    REQUEST_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_FIELD_NUMBER: _ClassVar[int]
    request: TransformSide
    response: TransformSide
    def __init__(self, request: _Optional[_Union[TransformSide, _Mapping]] = ..., response: _Optional[_Union[TransformSide, _Mapping]] = ...) -> None: ...

class TokenBudget(_message.Message):
    __slots__ = ("tokens", "window_seconds", "billed", "per", "default_max_tokens")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    BILLED_FIELD_NUMBER: _ClassVar[int]
    PER_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MAX_TOKENS_FIELD_NUMBER: _ClassVar[int]
    tokens: int
    window_seconds: int
    billed: bool
    per: str
    default_max_tokens: int
    def __init__(self, tokens: _Optional[int] = ..., window_seconds: _Optional[int] = ..., billed: _Optional[bool] = ..., per: _Optional[str] = ..., default_max_tokens: _Optional[int] = ...) -> None: ...

class TokenBudgetRule(_message.Message):
    __slots__ = ("policy_id", "budget")
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    policy_id: str
    budget: TokenBudget
    def __init__(self, policy_id: _Optional[str] = ..., budget: _Optional[_Union[TokenBudget, _Mapping]] = ...) -> None: ...

class ProcRoute(_message.Message):
    __slots__ = ("route_id", "tenant_id", "api_id", "guardrails", "transform", "token_budget")
    ROUTE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    API_ID_FIELD_NUMBER: _ClassVar[int]
    GUARDRAILS_FIELD_NUMBER: _ClassVar[int]
    TRANSFORM_FIELD_NUMBER: _ClassVar[int]
    TOKEN_BUDGET_FIELD_NUMBER: _ClassVar[int]
    route_id: str
    tenant_id: str
    api_id: str
    guardrails: Guardrails
    transform: Transform
    token_budget: TokenBudgetRule
    def __init__(self, route_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., api_id: _Optional[str] = ..., guardrails: _Optional[_Union[Guardrails, _Mapping]] = ..., transform: _Optional[_Union[Transform, _Mapping]] = ..., token_budget: _Optional[_Union[TokenBudgetRule, _Mapping]] = ...) -> None: ...

class ProcPolicySet(_message.Message):
    __slots__ = ("name", "version", "gateway_id", "routes")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    gateway_id: str
    routes: _containers.RepeatedCompositeFieldContainer[ProcRoute]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., gateway_id: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[ProcRoute, _Mapping]]] = ...) -> None: ...
