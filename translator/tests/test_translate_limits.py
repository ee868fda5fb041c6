"""The one count rule of a policy config (`stoa_translate.policies.limits`): every list and map of every
kind is bounded, the named ones by their own limit, the rest by `entries`; a refusal names the list and
the setting, and comes before any entry is read."""

from __future__ import annotations

import pytest
from stoa_translate.policies import KINDS, ConfigError, ListLimits, accept, accept_json

SMALL = ListLimits(origins=2, headers=2, addresses=3, patterns=1, entries=2)


@pytest.mark.parametrize(
    ("kind", "config", "field", "setting"),
    [
        ("cors", {"allowedOrigins": ["https://a.example", "https://b.example", "https://c.example"]},
         "allowedOrigins", "policy_max_origins"),
        ("cors", {"allowedOrigins": ["https://a.example"], "exposeHeaders": ["a", "b", "c"]},
         "exposeHeaders", "policy_max_headers"),
        ("cors", {"allowedOrigins": ["https://a.example"], "allowedMethods": ["GET", "PUT", "POST"]},
         "allowedMethods", "policy_max_entries"),
        ("ip_filter", {"mode": "allow", "ip_list": ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]},
         "ip_list", "policy_max_addresses"),
        ("guardrails", {"blockPatterns": ["a", "b"]}, "blockPatterns", "policy_max_patterns"),
        ("transform", {"request": {"headers": {"set": {"a": "1", "b": "2", "c": "3"}}}},
         "request.headers.set", "policy_max_entries"),
    ],
)  # fmt: skip
def test_a_list_past_its_limit_is_refused_naming_the_list_and_the_setting(
    kind: str, config: dict, field: str, setting: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        accept(kind, "p", config, SMALL)
    assert refused.value.field == field
    assert setting in refused.value.message


def test_the_count_comes_before_the_entries() -> None:
    # 3 entries that are not even strings: the count refuses, not the entry rule
    with pytest.raises(ConfigError, match="policy_max_origins"):
        accept("cors", "p", {"allowedOrigins": [1, 2, 3]}, SMALL)


def test_the_defaults_are_the_documented_ones_and_reachable() -> None:
    limits = ListLimits()
    assert (limits.origins, limits.headers, limits.addresses, limits.patterns, limits.entries) == (
        1_000,
        1_000,
        10_000,
        100,
        256,
    )
    origins = [f"https://o{i}.example" for i in range(1_000)]
    assert len(accept_json("cors", "p", {"allowedOrigins": origins})["allowedOrigins"]) == 1_000
    with pytest.raises(ConfigError, match="the limit is 1000"):
        accept("cors", "p", {"allowedOrigins": [*origins, "https://one-more.example"]})
    addresses = [f"10.0.{i // 256}.{i % 256}" for i in range(10_000)]
    assert len(accept_json("ip_filter", "p", {"mode": "deny", "ip_list": addresses})["ip_list"]) == 10_000


def test_every_named_list_is_a_key_of_its_kind_and_has_a_limit() -> None:
    for kind in KINDS.values():
        keys = {f.json_name for f in kind.message.DESCRIPTOR.fields}
        for key, attribute in kind.list_limits.items():
            assert key in keys, (kind.name, key)
            assert isinstance(getattr(ListLimits(), attribute), int), (kind.name, attribute)
