"""The published OpenAPI document, with what only the running CP knows: the list limits its settings
set (`policy_max_<limit>`), in place of the marks `stoa_cp.schemas.bounded` leaves in the schemas."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from stoa_cp.schemas import LIMIT
from stoa_cp.settings import Settings


def _publish_limits(node: Any, settings: Settings) -> None:
    if isinstance(node, list):
        for item in node:
            _publish_limits(item, settings)
        return
    if not isinstance(node, dict):
        return
    limit = node.pop(LIMIT, None)
    if limit is not None:
        count = getattr(settings.policy_limits, limit)
        node["maxProperties" if node.get("type") == "object" else "maxItems"] = count
        setting = f"STOA_CP_POLICY_MAX_{limit.upper()}"
        node["description"] = f"{node.get('description', '')} At most {count} ({setting}).".strip()
    for value in node.values():
        _publish_limits(value, settings)


def install(app: FastAPI, settings: Settings) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            _publish_limits(generate(), settings)
        return app.openapi_schema  # type: ignore[return-value]

    app.openapi = openapi  # type: ignore[method-assign]
