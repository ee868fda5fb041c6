"""Policy configs as the CP accepts them: by the translator's own rules (`stoa_translate.policies`),
run at the write, so a config the site would refuse is refused here (422 naming the field) and what is
stored is the normal form the site publishes (`get` → `GET`)."""

from __future__ import annotations

from typing import Any

from stoa_translate.policies import ConfigError, ListLimits, UnsupportedKind, accept_json

from stoa_cp.problems import Problem


def accepted(policy_type: str, policy_id: str, config: dict[str, Any], limits: ListLimits) -> dict[str, Any]:
    """The config in normal form, or a 422 Problem naming the type or the `config.*` field (a list
    longer than its limit included)."""
    try:
        return accept_json(policy_type, policy_id, config, limits)
    except UnsupportedKind as exc:
        raise Problem(422, "Unsupported policy type", [("type", str(exc))]) from None
    except ConfigError as exc:
        field = f"config.{exc.field}" if exc.field else "config"
        raise Problem(422, "Invalid policy config", [(field, exc.message)]) from None
