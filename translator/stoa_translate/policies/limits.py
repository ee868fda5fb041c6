"""How many entries one policy's lists may hold: the one rule for counts in a policy config.

Bounded so that one tenant's policy cannot slow every publication of a gateway it shares with others: a
valid CORS policy of 524,288 origins (10 MiB) made another tenant's one-route change take 6 to 10 s
instead of ~0.1 s and grew the Link to ~600 MiB.

`stoa_translate.policies.kind.read_config` applies it to each list and map as it reads a config, before
any of its entries; each kind names its own bounded lists (`PolicyKind.list_limits`), the CP's settings
set the numbers (`policy_max_<attribute>`), a refusal names the list and the setting."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ListLimits:
    """Entries per list of one policy config."""

    origins: int = 1_000  # cors allowedOrigins
    headers: int = 1_000  # cors allowedHeaders, exposeHeaders (each)
    addresses: int = 10_000  # ip_filter ip_list
    patterns: int = 100  # guardrails blockPatterns
    entries: int = 256  # any other list or map of a config (methods, header edits, JSON edits)


DEFAULT_LIMITS = ListLimits()


def bound(limits: ListLimits, bounded: Mapping[str, str], key: str) -> tuple[int, str]:
    """(how many entries the list `key` of a config may hold, the setting that says so). `bounded` is
    the kind's own `list_limits` (JSON key → ListLimits attribute); any other list is bounded by
    `entries`."""
    attribute = bounded.get(key, "entries")
    return getattr(limits, attribute), f"policy_max_{attribute}"
