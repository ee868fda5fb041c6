"""Rego modules compiled by regorus: one rule for the translator (a policy is refused when its module
does not compile) and the authorization service (which evaluates it)."""

from __future__ import annotations

import regorus

DEFAULT_ENTRYPOINT = "data.stoa.allow"


class RegoError(ValueError):
    """The module does not compile; the message is the engine's first line."""


def compiled(policy_id: str, module: str) -> regorus.Engine:
    """An engine holding `module` (Rego v1), or RegoError."""
    engine = regorus.Engine()
    try:
        engine.add_policy(f"{policy_id}.rego", module)
    except RuntimeError as exc:
        # The engine's message: the location and the error, then a Rust backtrace nobody needs.
        text = str(exc).split("Stack backtrace:")[0].strip()
        raise RegoError(" ".join(text.split())[:300] or "does not compile") from None
    return engine
