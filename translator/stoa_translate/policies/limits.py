"""How many entries one policy may list. Bounded so that one tenant's policy cannot slow every
publication of a gateway it shares with others: a valid CORS policy of 524,288 origins (10 MiB) made
another tenant's one-route change take 6 to 10 s instead of ~0.1 s and grew the Link to ~600 MiB.

The CP applies these at the write (its settings set the numbers); a refusal names the list and the
limit."""

from __future__ import annotations

from dataclasses import dataclass

from google.protobuf import message

from stoa_translate.policies.kind import ConfigError


@dataclass(frozen=True)
class ListLimits:
    """Entries per list of one policy config."""

    origins: int = 1_000  # cors allowedOrigins
    headers: int = 1_000  # cors allowedHeaders, exposeHeaders (each)
    addresses: int = 10_000  # ip_filter ip_list


DEFAULT_LIMITS = ListLimits()

# (kind, JSON key, typed config field, the ListLimits attribute bounding it)
BOUNDED_LISTS: tuple[tuple[str, str, str, str], ...] = (
    ("cors", "allowedOrigins", "allowed_origins", "origins"),
    ("cors", "allowedHeaders", "allowed_headers", "headers"),
    ("cors", "exposeHeaders", "expose_headers", "headers"),
    ("ip_filter", "ip_list", "ip_list", "addresses"),
)


def check_counts(kind_name: str, typed: message.Message, limits: ListLimits) -> None:
    """Raise ConfigError naming the first list of the config longer than its limit."""
    for kind, key, field, limit in BOUNDED_LISTS:
        if kind != kind_name:
            continue
        count = len(getattr(typed, field))
        bound = getattr(limits, limit)
        if count > bound:
            raise ConfigError(key, f"has {count} entries; the limit is {bound} (policy_max_{limit})")
