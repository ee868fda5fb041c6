"""A route's rules of one kind, as the translator decided them.

The translator's own parse (`stoa_translate.policies.<kind>`) is the one rule wherever a config is
read: what it refuses, the service refuses (the set is NACKed), in its words. And only its normal form
is taken: a set the translator did not make is refused, never completed here, so the service compiles
nothing the translator would not have published.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message
from google.protobuf.descriptor import FieldDescriptor
from stoa_ops.policy_sets import Refused
from stoa_translate.policies.kind import ConfigError, PolicyKind


class PolicyError(Refused):
    """A policy set the service cannot enforce (NACKed with this message)."""


def translated(kind: PolicyKind, config: message.Message, policy_id: str = "") -> Any:
    """The kind's IR of `config`; PolicyError if the translator refuses it or would have written it
    otherwise."""
    try:
        parsed = kind.parse(policy_id, config)
    except ConfigError as exc:
        raise PolicyError(str(exc)) from None
    normal = kind.normalised(parsed)
    if normal != config:
        raise PolicyError(f"config.{_difference(normal, config)} is not in the translator's normal form")
    return parsed


def _difference(normal: message.Message, given: message.Message, prefix: str = "") -> str:
    """The API key of the first field where `given` departs from `normal` (into nested rule messages)."""
    for field in normal.DESCRIPTOR.fields:
        ours, theirs = getattr(normal, field.name), getattr(given, field.name)
        key = f"{prefix}{field.json_name}"
        singular = field.type == FieldDescriptor.TYPE_MESSAGE and not field.is_repeated
        if singular and normal.HasField(field.name) != given.HasField(field.name):
            return key  # present in one, absent in the other (even if empty)
        if ours == theirs:
            continue
        nested = singular and field.message_type.full_name.startswith("stoa.")
        return _difference(ours, theirs, f"{key}.") if nested else key
    return prefix.rstrip(".") or "(unknown fields)"
