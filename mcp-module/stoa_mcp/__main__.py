"""`stoa-mcp`: check the settings, then run the MCP module."""

from __future__ import annotations

import asyncio
import logging
import sys

from stoa_ops import site_settings
from stoa_ops.logs import configure

from stoa_mcp.serve import serve
from stoa_mcp.settings import Settings, check

log = logging.getLogger("stoa_mcp")


def _refuse(message: str) -> int:
    return site_settings.refuse("stoa-mcp", log, message)


def main() -> int:
    configure(quiet=("httpx",))
    settings = site_settings.read("stoa-mcp", log, Settings, check)
    if isinstance(settings, int):
        return settings
    try:
        asyncio.run(serve(settings))
    except ValueError as exc:
        return _refuse(str(exc))
    except OSError as exc:
        return _refuse(f"cannot start: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
