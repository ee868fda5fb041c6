from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Tool(_message.Message):
    __slots__ = ("tenant_id", "name", "description", "input_schema_json", "output_schema_json", "annotations_json", "api_id", "method", "path_template", "upstream_url", "timeout_ms", "budget_calls", "budget_window_s")
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    ANNOTATIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    API_ID_FIELD_NUMBER: _ClassVar[int]
    METHOD_FIELD_NUMBER: _ClassVar[int]
    PATH_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    UPSTREAM_URL_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_CALLS_FIELD_NUMBER: _ClassVar[int]
    BUDGET_WINDOW_S_FIELD_NUMBER: _ClassVar[int]
    tenant_id: str
    name: str
    description: str
    input_schema_json: str
    output_schema_json: str
    annotations_json: str
    api_id: str
    method: str
    path_template: str
    upstream_url: str
    timeout_ms: int
    budget_calls: int
    budget_window_s: int
    def __init__(self, tenant_id: _Optional[str] = ..., name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., output_schema_json: _Optional[str] = ..., annotations_json: _Optional[str] = ..., api_id: _Optional[str] = ..., method: _Optional[str] = ..., path_template: _Optional[str] = ..., upstream_url: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., budget_calls: _Optional[int] = ..., budget_window_s: _Optional[int] = ...) -> None: ...

class McpRoute(_message.Message):
    __slots__ = ("route_id", "tenant_id", "api_id", "path_prefix")
    ROUTE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    API_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_PREFIX_FIELD_NUMBER: _ClassVar[int]
    route_id: str
    tenant_id: str
    api_id: str
    path_prefix: str
    def __init__(self, route_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., api_id: _Optional[str] = ..., path_prefix: _Optional[str] = ...) -> None: ...

class McpPolicySet(_message.Message):
    __slots__ = ("name", "version", "gateway_id", "routes", "tools")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    gateway_id: str
    routes: _containers.RepeatedCompositeFieldContainer[McpRoute]
    tools: _containers.RepeatedCompositeFieldContainer[Tool]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., gateway_id: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[McpRoute, _Mapping]]] = ..., tools: _Optional[_Iterable[_Union[Tool, _Mapping]]] = ...) -> None: ...

class ToolPermissions(_message.Message):
    __slots__ = ("name", "version", "seq", "jws")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    JWS_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    seq: int
    jws: str
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., seq: _Optional[int] = ..., jws: _Optional[str] = ...) -> None: ...
