"""The service takes a route's rules as the translator decided them: what the translator refuses, the
service refuses in the same words; rules in another form than the translator's normal form are
refused; and every processing policy set the translator's goldens render compiles."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format, message
from stoa_proc.guardrails import PII_KINDS, compile_guardrails
from stoa_proc.policy import compile_policy_set
from stoa_proc.rules import PolicyError
from stoa_proc.transform import compile_transform
from stoa_proto import proc_pb2
from stoa_translate.policies import KINDS, ConfigError
from stoa_translate.policies import guardrails as guardrails_kind

GOLDEN = Path(__file__).resolve().parents[2] / "translator" / "tests" / "golden"
LIMIT = 64 * 1024
COMPILERS: dict[str, Callable[[Any], object]] = {
    "guardrails": lambda config: compile_guardrails(config, LIMIT),
    "transform": compile_transform,
}


def _golden_refusals() -> list[Any]:
    """The configs of the service's kinds in the translator's refused goldens."""
    cases = []
    for inventory in sorted(GOLDEN.glob("refuse_bad_*/inventory.json")):
        for policy in json.loads(inventory.read_text()).get("policies", []):
            if policy["type"] in COMPILERS:
                cases.append(pytest.param(policy["type"], policy[policy["type"]], id=inventory.parent.name))
    return cases


# One config for each rule of the translator's guardrails and transform parse.
REFUSED = [
    ("guardrails", {"direction": "sideways", "blockPatterns": ["x"]}),
    ("guardrails", {"blockPatterns": ["(a+)+\\1"]}),
    # Valid RE2 as written, not in the NFKC form the service matches it in: "(unclosed".
    ("guardrails", {"blockPatterns": ["ok", "\uff08unclosed"]}),
    ("guardrails", {"pii": {"kinds": ["ssn"], "action": "block"}}),
    ("guardrails", {"pii": {"kinds": ["email", "email"], "action": "block"}}),
    ("guardrails", {"pii": {"kinds": ["email"], "action": "mask"}}),
    ("guardrails", {"maxBodyBytes": 10, "pii": {"action": "block"}}),
    ("guardrails", {"jsonSchema": {"type": 12}}),
    ("guardrails", {"direction": "both"}),
    ("transform", {}),
    ("transform", {"request": {"headers": {"set": {"X-Upper": "1"}}}}),
    ("transform", {"request": {"headers": {"remove": ["x-stoa-tenant-id"]}}}),
    ("transform", {"response": {"json": [{"op": "set", "path": "/a"}]}}),
    ("transform", {"request": {"json": [{"op": "move", "path": "/a"}]}}),
    ("transform", {"request": {"json": [{"op": "remove", "path": "a"}]}}),
    ("transform", {"request": {"json": [{"op": "rename", "path": "/a", "to": "b"}]}}),
]


def _typed(kind: str, config: dict[str, Any]) -> message.Message:
    # As a message, the way the service receives it: only the translator's parse decides.
    return json_format.ParseDict(config, KINDS[kind].message())


@pytest.mark.parametrize(("kind", "config"), [*_golden_refusals(), *REFUSED])
def test_the_service_refuses_what_the_translator_refuses_in_its_words(kind: str, config: dict) -> None:
    typed = _typed(kind, config)
    with pytest.raises(ConfigError) as translator:
        KINDS[kind].parse("p", typed)
    with pytest.raises(PolicyError) as service:
        COMPILERS[kind](typed)
    assert str(service.value) == str(translator.value)


@pytest.mark.parametrize(
    ("kind", "config", "named"),
    [
        # The translator always spells out the direction and a PII action.
        ("guardrails", proc_pb2.Guardrails(block_patterns=["x"]), "config.direction"),
        (
            "guardrails",
            proc_pb2.Guardrails(direction="request", pii={"kinds": ["email"]}),
            "config.pii.action",
        ),
        # A remove edit never carries a target.
        (
            "transform",
            _typed("transform", {"request": {"json": [{"op": "remove", "path": "/a", "to": "/b"}]}}),
            "config.request",
        ),
    ],
)
def test_rules_not_in_the_translators_normal_form_are_refused(
    kind: str, config: message.Message, named: str
) -> None:
    KINDS[kind].parse("p", config)  # the translator would take them, and write them otherwise
    with pytest.raises(PolicyError, match=f"^{named}.* normal form"):
        COMPILERS[kind](config)


def test_every_set_the_translator_renders_compiles() -> None:
    rendered = [
        json_format.Parse(path.read_text(), proc_pb2.ProcPolicySet())
        for path in sorted(GOLDEN.glob("*/expected/proc_policy_set.default.json"))
    ]
    with_routes = [s for s in rendered if s.routes]
    kinds = {k for s in with_routes for r in s.routes for k in ("guardrails", "transform") if r.HasField(k)}
    assert kinds == {"guardrails", "transform"}
    for policy_set in with_routes:
        compiled = compile_policy_set(policy_set, LIMIT)
        assert sorted(compiled.routes) == sorted(r.route_id for r in policy_set.routes)


def test_the_pii_kinds_are_the_translators() -> None:
    assert sorted(PII_KINDS) == sorted(guardrails_kind.PII_KINDS)
