"""How many entries one policy's lists may hold: the one rule for counts in a policy config.

Bounded so that one tenant's policy cannot slow every publication of a gateway it shares with others: a
valid CORS policy of 524,288 origins (10 MiB) made another tenant's one-route change take 6 to 10 s
instead of ~0.1 s and grew the Link to ~600 MiB.

`stoa_translate.policies.kind.read_config` applies it to each list and map as it reads a config, before
any of its entries; the CP's settings set the numbers (`policy_max_<attribute>`), a refusal names the
list and the setting."""

from __future__ import annotations

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

# (kind, JSON key, the ListLimits attribute bounding it); a list not named here is bounded by `entries`.
BOUNDED_LISTS: dict[tuple[str, str], str] = {
    ("cors", "allowedOrigins"): "origins",
    ("cors", "allowedHeaders"): "headers",
    ("cors", "exposeHeaders"): "headers",
    ("ip_filter", "ip_list"): "addresses",
    ("guardrails", "blockPatterns"): "patterns",
}


def bound(limits: ListLimits, kind_name: str, key: str) -> tuple[int, str]:
    """(how many entries the list `key` of a `kind_name` config may hold, the setting that says so)."""
    attribute = BOUNDED_LISTS.get((kind_name, key), "entries")
    return getattr(limits, attribute), f"policy_max_{attribute}"
