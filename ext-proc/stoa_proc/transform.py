"""Phase 3, transform: a route's header and JSON edits, applied after the guardrails passed.

JSON edits address the body by JSON pointer (RFC 6901): `set` writes a value (creating the member,
or appending with `-` in an array), `remove` deletes one, `rename` moves one to another pointer. An
edit whose target is absent is skipped (`set` into a missing parent, `remove`/`rename` of a missing
member): a transform shapes what is there, it never fails a request for what is not.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

from stoa_proto import proc_pb2
from stoa_translate.policies import transform as transform_kind

from stoa_proc.rules import translated


@dataclass(frozen=True, slots=True)
class Edit:
    op: str
    path: tuple[str, ...]
    value: Any
    to: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Side:
    set_headers: tuple[tuple[str, str], ...]
    remove_headers: tuple[str, ...]
    json: tuple[Edit, ...]

    @property
    def headers(self) -> bool:
        return bool(self.set_headers or self.remove_headers)

    def edit(self, document: Any) -> Any:
        """The document with every edit applied, in order (a copy; the input is left as it was)."""
        edited = copy.deepcopy(document)
        for edit in self.json:
            if edit.op == "set":
                edited = _set(edited, edit.path, copy.deepcopy(edit.value))
            elif edit.op == "remove":
                _pop(edited, edit.path)
            else:
                found, value = _pop(edited, edit.path)
                if found:
                    edited = _set(edited, edit.to, value)
        return edited


@dataclass(frozen=True, slots=True)
class Transform:
    request: Side
    response: Side


def pointer(text: str) -> tuple[str, ...]:
    """The reference tokens of a JSON pointer (the translator checked its syntax)."""
    return tuple(part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/"))


def _parent(document: Any, path: tuple[str, ...]) -> Any:
    node = document
    for part in path[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def _set(document: Any, path: tuple[str, ...], value: Any) -> Any:
    parent, key = _parent(document, path), path[-1]
    if isinstance(parent, dict):
        parent[key] = value
    elif isinstance(parent, list):
        if key == "-":
            parent.append(value)
        elif key.isdigit() and int(key) < len(parent):
            parent[int(key)] = value
    return document


def _pop(document: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    parent, key = _parent(document, path), path[-1]
    if isinstance(parent, dict) and key in parent:
        return True, parent.pop(key)
    if isinstance(parent, list) and key.isdigit() and int(key) < len(parent):
        return True, parent.pop(int(key))
    return False, None


def _side(side: transform_kind.Side) -> Side:
    edits = tuple(
        Edit(
            edit.op,
            pointer(edit.path),
            json.loads(edit.value) if edit.op == "set" else None,
            pointer(edit.to) if edit.op == "rename" else (),
        )
        for edit in side.json
    )
    return Side(side.set_headers, side.remove_headers, edits)


def compile_transform(config: proc_pb2.Transform) -> Transform:
    """The runtime edits of a route's transform, in the translator's normal form (else PolicyError)."""
    rules = translated(transform_kind.KIND, config)
    return Transform(_side(rules.request), _side(rules.response))


def dump(document: Any) -> bytes:
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()
