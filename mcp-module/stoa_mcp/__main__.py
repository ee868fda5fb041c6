"""`stoa-mcp`: check the settings, then run the MCP module."""

from __future__ import annotations

import asyncio
import logging
import sys

from pydantic import ValidationError
from stoa_ops.logs import configure

from stoa_mcp.serve import serve
from stoa_mcp.settings import ConfigError, Settings, check

log = logging.getLogger("stoa_mcp")


def _refuse(message: str) -> int:
    log.error(message)
    print(f"stoa-mcp: {message}", file=sys.stderr)
    return 2


def main() -> int:
    configure(quiet=("httpx",))
    try:
        settings = Settings()
        warnings = check(settings)
    except ValidationError as exc:
        return _refuse(f"invalid settings: {exc}")
    except ConfigError as exc:
        return _refuse(str(exc))
    for warning in warnings:
        log.warning(warning)
    try:
        asyncio.run(serve(settings))
    except ValueError as exc:
        return _refuse(str(exc))
    except OSError as exc:
        return _refuse(f"cannot start: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
