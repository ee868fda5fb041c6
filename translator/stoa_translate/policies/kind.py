"""What every policy kind answers, and how a policy's JSON config becomes its typed message."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping, Sequence, Sized
from dataclasses import dataclass, field
from typing import Any, TypeVar

from google.protobuf import json_format, message
from google.protobuf.descriptor import FieldDescriptor

from stoa_translate.policies.limits import DEFAULT_LIMITS, ListLimits, bound

M = TypeVar("M", bound=message.Message)
MAX_UINT32 = 2**32 - 1
# Bound on each text entry of a config; counts of lists are `limits.ListLimits`.
MAX_TEXT = 256
# Bound on a free-form JSON document inside a config (a JSON Schema), serialised.
MAX_DOCUMENT = 64 * 1024


class ConfigError(ValueError):
    """A config the rules refuse; `field` is the key in the API's (and proto3 JSON's) terms, with an
    index where one entry is at fault (`allowedOrigins[2]`), empty for the config as a whole."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"config.{field} {message}" if field else f"config {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class PolicyKind:
    """One policy kind: the hooks the translator and the CP call, neither naming the kind itself.

    - `message`: its typed contract (the member of `Policy.config` named like the kind);
    - `parse`: (policy id, typed config) → the kind's IR, frozen and hashable; raises ConfigError;
    - `normalised`: IR → the typed config in its normal form (what the CP stores and serves);
    - `listener_filter`: the HTTP filter it needs on the listener (once, there from the first
      publication whether or not a route uses the kind), off until a route's per-route config
      switches it on;
    - `route_config`: (route id, IR) → the typed_per_filter_config it puts on that route's entries;
    - `extra_methods`: methods a method-constrained route must also match while the kind applies;
    - `list_limits`: its lists bounded by a limit of their own (JSON key → `limits.ListLimits`
      attribute); any other list of its config is bounded by `entries`;
    - `long_text`: keys whose text may be as long as a document (a Rego module), not one entry.

    A kind decided wholly by the authorization service (its config travels in the service's policy
    set) has no filter: `filter_name` empty, `listener_filter` and `route_config` None.

    A kind whose filter is configured per setting (compression: one compressor per algorithm and
    size threshold, since a route cannot override either) gives instead:
    - `listener_filters`: (the IRs of every route using it) → its filter instances, by name, all
      standing at the position of `filter_name` in the order table;
    - `route_configs`: (route id, IR) → the per-route config of each instance the route switches on.
    """

    name: str
    filter_name: str
    message: type[message.Message]
    parse: Callable[[str, Any], Any]
    normalised: Callable[[Any], message.Message]
    listener_filter: Callable[[], message.Message] | None
    route_config: Callable[[str, Any], message.Message] | None
    extra_methods: tuple[str, ...] = ()
    list_limits: Mapping[str, str] = field(default_factory=dict)
    long_text: frozenset[str] = frozenset()
    listener_filters: Callable[[Sequence[Any]], list[tuple[str, message.Message]]] | None = None
    route_configs: Callable[[str, Any], dict[str, message.Message]] | None = None

    def filters(self, used: Sequence[Any]) -> list[tuple[str, message.Message]]:
        """The listener's filters for this kind, given the IRs of the routes that use it (only a kind
        configured per setting reads them)."""
        if self.listener_filters is not None:
            return self.listener_filters(used)
        return [] if self.listener_filter is None else [(self.filter_name, self.listener_filter())]

    def per_route(self, route_id: str, ir: Any) -> dict[str, message.Message]:
        """typed_per_filter_config entries (filter name → config) for one route using this kind."""
        if self.route_configs is not None:
            return self.route_configs(route_id, ir)
        return {} if self.route_config is None else {self.filter_name: self.route_config(route_id, ir)}


def mirrored(ir: Any, typed: type[M]) -> M:
    """The normal form of a kind whose IR holds its message's fields by the same names (and the policy
    id): the IR's values in a new `typed` message."""
    return typed(**{f.name: getattr(ir, f.name) for f in dataclasses.fields(ir) if f.name != "policy_id"})


def read_config(kind: PolicyKind, config: object, limits: ListLimits = DEFAULT_LIMITS) -> message.Message:
    """A JSON config (API keys, which are the message's JSON names) as the kind's typed message.

    Strict about JSON types (a number is not a string, a boolean is not a number), unknown keys
    refused by name; a null is the key left out. A list or map longer than `limits` allow is refused
    before any of its entries is read.
    """
    if not isinstance(config, Mapping):
        raise ConfigError("", "must be a JSON object")
    typed = kind.message()
    _read(typed, config, _Context(kind, limits), "")
    return typed


@dataclass(frozen=True)
class _Context:
    kind: PolicyKind
    limits: ListLimits

    def count(self, key: str, value: Sized) -> None:
        limit, setting = bound(self.limits, self.kind.list_limits, key)
        if len(value) > limit:
            raise ConfigError(key, f"has {len(value)} entries; the limit is {limit} ({setting})")


def _read(typed: message.Message, config: Mapping[str, Any], context: _Context, prefix: str) -> None:
    by_key = {f.json_name: f for f in typed.DESCRIPTOR.fields}
    for name, value in config.items():
        key = f"{prefix}{name}"
        field = by_key.get(name)
        if field is None:
            keys = ", ".join(by_key)
            raise ConfigError(key, f"is not a key of a {context.kind.name} config (keys: {keys})")
        if value is None:
            continue
        if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            if not isinstance(value, Mapping):
                raise ConfigError(key, "must be an object of string values")
            context.count(key, value)
            _string_map(getattr(typed, field.name), key, value)
        elif field.type == FieldDescriptor.TYPE_MESSAGE and field.is_repeated:
            if not isinstance(value, list):
                raise ConfigError(key, "must be a list of objects")
            context.count(key, value)
            for i, entry in enumerate(value):
                _message(getattr(typed, field.name).add(), f"{key}[{i}]", entry, context)
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            _message(getattr(typed, field.name), key, value, context)
        elif field.is_repeated:
            if not isinstance(value, list):
                raise ConfigError(key, "must be a list of strings")
            context.count(key, value)
            if not all(isinstance(v, str) for v in value):
                raise ConfigError(key, "must be a list of strings")
            for i, entry in enumerate(value):
                _text(f"{key}[{i}]", entry)
            getattr(typed, field.name).extend(value)
        else:
            setattr(
                typed,
                field.name,
                _scalar(key, field, value, MAX_DOCUMENT if key in context.kind.long_text else MAX_TEXT),
            )


def _string_map(target: Any, key: str, value: Mapping[str, Any]) -> None:
    for name, entry in value.items():
        if not isinstance(entry, str):
            raise ConfigError(f"{key}.{name}", "must be a string")
        target[_text(key, name)] = _text(f"{key}.{name}", entry)


def _message(target: message.Message, key: str, value: object, context: _Context) -> None:
    """A nested object: a free-form one (google.protobuf.Struct, e.g. a JSON Schema; Value, any JSON)
    as it is, bounded in size; a typed one by the same rules as the config itself."""
    free_form = target.DESCRIPTOR.full_name in ("google.protobuf.Struct", "google.protobuf.Value")
    if not isinstance(value, Mapping) and not free_form:
        raise ConfigError(key, "must be a JSON object")
    if free_form:
        if len(json.dumps(value)) > MAX_DOCUMENT:
            raise ConfigError(key, f"must be at most {MAX_DOCUMENT} characters as JSON")
        try:
            json_format.ParseDict(value, target)
        except json_format.ParseError as exc:
            raise ConfigError(key, f"is not JSON of the expected shape ({exc})") from None
        return
    target.SetInParent()
    _read(target, value, context, f"{key}.")


def _text(key: str, value: str, limit: int = MAX_TEXT) -> str:
    if len(value) > limit:
        raise ConfigError(key, f"must be at most {limit} characters")
    # A document keeps its line structure; anything else is one printable line.
    lines = value.replace("\t", " ").split("\n") if limit > MAX_TEXT else [value]
    if not all(line.isprintable() for line in lines):
        raise ConfigError(key, "must not contain control characters")
    return value


def _scalar(key: str, field: FieldDescriptor, value: object, limit: int = MAX_TEXT) -> Any:
    if field.type == FieldDescriptor.TYPE_STRING:
        if not isinstance(value, str):
            raise ConfigError(key, "must be a string")
        return _text(key, value, limit)
    if field.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise ConfigError(key, "must be true or false")
        return value
    if field.type == FieldDescriptor.TYPE_UINT32:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UINT32:
            raise ConfigError(key, f"must be a whole number from 0 to {MAX_UINT32}")
        return value
    raise ConfigError(key, "has a type no policy config uses")  # a contract edit without a rule here


def config_json(typed: message.Message) -> dict[str, Any]:
    """The typed config as the API shows it (JSON names, defaults left out)."""
    return json_format.MessageToDict(typed)
