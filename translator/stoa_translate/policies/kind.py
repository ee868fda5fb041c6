"""What every policy kind answers, and the typed reads of a policy's config its `parse` uses."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import message

from stoa_translate.refusal import Refusal, invalid


@dataclass(frozen=True)
class PolicyKind:
    """One policy kind: the hooks the translator calls, never naming the kind itself.

    - `parse`: (policy id, config) → the kind's IR, frozen and hashable; raises `Refusal`;
    - `listener_filter`: the HTTP filter it needs on the listener (once, whatever the number of
      routes using it), inert until a route's per-route config switches it on;
    - `route_config`: (route id, IR) → the typed_per_filter_config it puts on that route's entries;
    - `extra_methods`: methods a method-constrained route must also match while the kind applies.
    """

    name: str
    filter_name: str
    parse: Callable[[str, Mapping[str, Any]], Any]
    listener_filter: Callable[[], message.Message]
    route_config: Callable[[str, Any], message.Message]
    extra_methods: tuple[str, ...] = ()


MAX_UINT32 = 2**32 - 1


class ConfigReader:
    """Typed reads of one policy's config, refusing anything unexpected with the key named."""

    def __init__(self, policy_id: str, config: Mapping[str, Any], keys: tuple[str, ...]) -> None:
        self.policy_id = policy_id
        self.config = config
        unknown = sorted(set(config) - set(keys))
        if unknown:
            raise self.invalid(unknown[0], "is not a known key")

    def invalid(self, key: str, what: str) -> Refusal:
        return invalid(f"policy {self.policy_id}: config.{key} {what}")

    def strings(self, key: str, *, required: bool = False) -> tuple[str, ...]:
        value = self.config.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise self.invalid(key, "must be a list of non-empty strings")
        if required and not value:
            raise self.invalid(key, "must not be empty")
        return tuple(value)

    def integer(self, key: str, *, minimum: int) -> int:
        value = self.config.get(key)
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
            or value != int(value)
            or value < minimum
            or value > MAX_UINT32
        ):
            raise self.invalid(key, f"must be a whole number of at least {minimum}")
        return int(value)

    def optional_integer(self, key: str, *, minimum: int) -> int | None:
        return None if self.config.get(key) is None else self.integer(key, minimum=minimum)

    def boolean(self, key: str) -> bool:
        value = self.config.get(key, False)
        if not isinstance(value, bool):
            raise self.invalid(key, "must be true or false")
        return value
