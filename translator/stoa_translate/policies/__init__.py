"""The policy kinds the translator supports: one module each, registered in this one table.

Adding a kind is its module (parse → IR → listener filter → per-route config), its line here, its
position in `stoa_translate.filters.HTTP_FILTER_ORDER` when it brings a new filter, and its message in
`Policy.config` (proto/); the translator and the CP never name a kind.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import message

from stoa_translate.filters import EXT_PROC_FILTER
from stoa_translate.policies import (
    compression,
    cors,
    guardrails,
    ip_filter,
    opa,
    rate_limit,
    token_budget,
    transform,
)
from stoa_translate.policies.kind import ConfigError, PolicyKind, config_json, read_config
from stoa_translate.policies.limits import DEFAULT_LIMITS, ListLimits

_ALL = (cors, rate_limit, ip_filter, guardrails, transform, opa, compression, token_budget)
KINDS: dict[str, PolicyKind] = {module.KIND.name: module.KIND for module in _ALL}
SUPPORTED_KINDS: tuple[str, ...] = tuple(KINDS)
# The kinds the processing service enforces: a route with one of them gets a processing stream.
PROCESSING_KINDS: tuple[str, ...] = tuple(k.name for k in KINDS.values() if k.filter_name == EXT_PROC_FILTER)


class UnsupportedKind(ValueError):
    def __init__(self, kind: str) -> None:
        super().__init__(f"{kind!r} is not a supported policy type (supported: {', '.join(SUPPORTED_KINDS)})")


def accept(
    kind_name: str, policy_id: str, config: object, limits: ListLimits = DEFAULT_LIMITS
) -> message.Message:
    """A policy config as written to the CP → its typed config in normal form (`get` → `GET`).

    The write-time face of the rules the translator applies at the site: raises UnsupportedKind or
    ConfigError (naming the key), so what is accepted here is what the site accepts. Lists longer than
    `limits` are refused before any of their entries is checked.
    """
    kind = KINDS.get(kind_name)
    if kind is None:
        raise UnsupportedKind(kind_name)
    typed = read_config(kind, config, limits)
    return kind.normalised(kind.parse(policy_id, typed))


def accept_json(
    kind_name: str, policy_id: str, config: object, limits: ListLimits = DEFAULT_LIMITS
) -> dict[str, Any]:
    """`accept`, as the JSON object the API stores and shows."""
    return config_json(accept(kind_name, policy_id, config, limits))


__all__ = [
    "KINDS",
    "PROCESSING_KINDS",
    "SUPPORTED_KINDS",
    "ConfigError",
    "ListLimits",
    "PolicyKind",
    "UnsupportedKind",
    "accept",
    "accept_json",
    "read_config",
]
