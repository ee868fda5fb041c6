"""Hooks of the fuzz run (test_cp_openapi.py), loaded through SCHEMATHESIS_HOOKS."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def filter_body(context: Any, body: Any) -> bool:
    """Leave out guardrails configs with an RE2 pattern or a JSON Schema: whether a text is valid RE2,
    or a valid JSON Schema, is a grammar no JSON Schema states; such a config is the documented 422
    naming it, and `test_cp_policies.py` covers it."""
    if not isinstance(body, dict):
        return True
    if body.get("type") == "opa":
        # Whether a text is a Rego module that compiles is Rego's grammar: the documented 422.
        return False
    if body.get("type") != "guardrails":
        return True
    config = body.get("config")
    return not (isinstance(config, dict) and (config.get("blockPatterns") or "jsonSchema" in config))
