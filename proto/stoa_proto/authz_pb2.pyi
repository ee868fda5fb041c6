from stoa_proto import inventory_pb2 as _inventory_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AuthzRoute(_message.Message):
    __slots__ = ("route_id", "tenant_id", "api_id", "auth_mode", "scopes", "verified_by_envoy", "envelope", "key_header", "subscription", "opa")
    ROUTE_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_ID_FIELD_NUMBER: _ClassVar[int]
    API_ID_FIELD_NUMBER: _ClassVar[int]
    AUTH_MODE_FIELD_NUMBER: _ClassVar[int]
    SCOPES_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_BY_ENVOY_FIELD_NUMBER: _ClassVar[int]
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    KEY_HEADER_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    OPA_FIELD_NUMBER: _ClassVar[int]
    route_id: str
    tenant_id: str
    api_id: str
    auth_mode: str
    scopes: _containers.RepeatedScalarFieldContainer[str]
    verified_by_envoy: bool
    envelope: bool
    key_header: str
    subscription: bool
    opa: _inventory_pb2.OpaPolicy
    def __init__(self, route_id: _Optional[str] = ..., tenant_id: _Optional[str] = ..., api_id: _Optional[str] = ..., auth_mode: _Optional[str] = ..., scopes: _Optional[_Iterable[str]] = ..., verified_by_envoy: _Optional[bool] = ..., envelope: _Optional[bool] = ..., key_header: _Optional[str] = ..., subscription: _Optional[bool] = ..., opa: _Optional[_Union[_inventory_pb2.OpaPolicy, _Mapping]] = ...) -> None: ...

class AuthzPolicySet(_message.Message):
    __slots__ = ("name", "version", "gateway_id", "routes", "issuers", "consumers", "subscriptions", "revoked_key_sha256")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    GATEWAY_ID_FIELD_NUMBER: _ClassVar[int]
    ROUTES_FIELD_NUMBER: _ClassVar[int]
    ISSUERS_FIELD_NUMBER: _ClassVar[int]
    CONSUMERS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTIONS_FIELD_NUMBER: _ClassVar[int]
    REVOKED_KEY_SHA256_FIELD_NUMBER: _ClassVar[int]
    name: str
    version: str
    gateway_id: str
    routes: _containers.RepeatedCompositeFieldContainer[AuthzRoute]
    issuers: _containers.RepeatedCompositeFieldContainer[_inventory_pb2.TrustedIssuer]
    consumers: _containers.RepeatedCompositeFieldContainer[_inventory_pb2.Consumer]
    subscriptions: _containers.RepeatedCompositeFieldContainer[_inventory_pb2.Subscription]
    revoked_key_sha256: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, name: _Optional[str] = ..., version: _Optional[str] = ..., gateway_id: _Optional[str] = ..., routes: _Optional[_Iterable[_Union[AuthzRoute, _Mapping]]] = ..., issuers: _Optional[_Iterable[_Union[_inventory_pb2.TrustedIssuer, _Mapping]]] = ..., consumers: _Optional[_Iterable[_Union[_inventory_pb2.Consumer, _Mapping]]] = ..., subscriptions: _Optional[_Iterable[_Union[_inventory_pb2.Subscription, _Mapping]]] = ..., revoked_key_sha256: _Optional[_Iterable[str]] = ...) -> None: ...
