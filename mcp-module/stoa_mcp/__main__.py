"""`stoa-mcp`: check the settings, then run the MCP module (on uvloop)."""

from __future__ import annotations

import logging
import sys

import uvloop
from stoa_ops import site_settings
from stoa_ops.logs import configure

from stoa_mcp.serve import serve
from stoa_mcp.settings import Settings, check

log = logging.getLogger("stoa_mcp")


def main() -> int:
    configure(quiet=("aiohttp",))
    # ValueError: the pinned keys file cannot be used.
    return site_settings.run_service(
        "stoa-mcp", log, Settings, check, serve, run=uvloop.run, refused=(ValueError,)
    )


if __name__ == "__main__":
    sys.exit(main())
