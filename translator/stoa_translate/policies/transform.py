"""transform → the processing service (`envoy.filters.http.ext_proc`): headers set and removed, JSON
bodies edited by JSON pointer (`set`, `remove`, `rename`), on requests and on responses.

Like guardrails, the route switches on only the phases its edits need: the headers of a side with
header edits, the buffered body of a side with JSON edits. The edits travel to the service in its
policy set (`stoa.proc.v1.Transform`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from envoy.extensions.filters.http.ext_proc.v3 import ext_proc_pb2
from google.protobuf import json_format
from stoa_proto import proc_pb2

from stoa_translate.fields import is_header_name
from stoa_translate.filters import EXT_PROC_FILTER, ext_proc_filter, ext_proc_route
from stoa_translate.policies.kind import ConfigError, PolicyKind

OPS = ("set", "remove", "rename")
# What no transform may touch: the request line, framing, and the identity the gateway vouches for.
_PROTECTED = re.compile(r"^(:.*|host|content-length|transfer-encoding|x-stoa-.*)$")
_POINTER = re.compile(r"^(/([^~/]|~[01])*)+$")


@dataclass(frozen=True)
class JsonEdit:
    op: str
    path: str
    value: str  # canonical JSON text of the value "set" writes ("" otherwise)
    to: str


@dataclass(frozen=True)
class Side:
    set_headers: tuple[tuple[str, str], ...]
    remove_headers: tuple[str, ...]
    json: tuple[JsonEdit, ...]

    @property
    def empty(self) -> bool:
        return not (self.set_headers or self.remove_headers or self.json)


@dataclass(frozen=True)
class Transform:
    policy_id: str
    request: Side
    response: Side

    @property
    def request_buffer_bytes(self) -> int | None:
        # JSON edits read the whole request body: buffered, at the default limit.
        return 0 if self.request.json else None

    @property
    def sends_request_headers(self) -> bool:
        # Always: to edit them, to open the stream, or because a JSON edit rewrites the body (an
        # encoded one is re-sent plain, `content-encoding` removed: Envoy edits only headers the
        # service was sent).
        return True

    def message(self) -> proc_pb2.Transform:
        rules = proc_pb2.Transform()
        for side, target in ((self.request, rules.request), (self.response, rules.response)):
            if side.empty:
                continue
            target.SetInParent()
            target.headers.set.update(dict(side.set_headers))
            target.headers.remove.extend(side.remove_headers)
            for edit in side.json:
                added = target.json.add(op=edit.op, path=edit.path, to=edit.to)
                if edit.op == "set":
                    json_format.Parse(edit.value, added.value)
        return rules


def _side(name: str, config: proc_pb2.TransformSide) -> Side:
    for header in (*config.headers.set, *config.headers.remove):
        if not is_header_name(header, lower_case=True):
            raise ConfigError(f"{name}.headers", f"{header!r} is not a lower-case header name")
        if _PROTECTED.match(header):
            raise ConfigError(f"{name}.headers", f"{header!r} is not a header a transform may change")
    edits = []
    for i, edit in enumerate(config.json):
        where = f"{name}.json[{i}]"
        if edit.op not in OPS:
            raise ConfigError(f"{where}.op", f"must be one of {', '.join(OPS)}")
        if not _POINTER.match(edit.path):
            raise ConfigError(f"{where}.path", "must be a JSON pointer to a member (/a/b, /items/0)")
        if edit.op == "set" and not edit.HasField("value"):
            raise ConfigError(f"{where}.value", "is required for set")
        if edit.op == "rename" and not _POINTER.match(edit.to):
            raise ConfigError(f"{where}.to", "must be a JSON pointer for rename")
        value = json.dumps(json_format.MessageToDict(edit.value), sort_keys=True) if edit.op == "set" else ""
        edits.append(JsonEdit(edit.op, edit.path, value, edit.to if edit.op == "rename" else ""))
    return Side(
        set_headers=tuple(sorted(config.headers.set.items())),
        remove_headers=tuple(config.headers.remove),
        json=tuple(edits),
    )


def parse(policy_id: str, config: proc_pb2.Transform) -> Transform:
    rules = Transform(policy_id, _side("request", config.request), _side("response", config.response))
    if rules.request.empty and rules.response.empty:
        raise ConfigError("", "needs a request or response edit")
    return rules


def normalised(rules: Transform) -> proc_pb2.Transform:
    return rules.message()


def route_config(route_id: str, rules: Transform) -> ext_proc_pb2.ExtProcPerRoute:
    return ext_proc_route(
        route_id,
        request_headers=True,
        request_body=bool(rules.request.json),
        response_headers=not rules.response.empty,
        response_body=bool(rules.response.json),
    )


KIND = PolicyKind(
    "transform", EXT_PROC_FILTER, proc_pb2.Transform, parse, normalised, ext_proc_filter, route_config
)
