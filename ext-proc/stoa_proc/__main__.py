"""`stoa-proc`: check the settings, then run the processing service."""

from __future__ import annotations

import asyncio
import logging
import sys

from stoa_ops import logs, site_settings

from stoa_proc.serve import serve
from stoa_proc.settings import Settings, check

log = logging.getLogger("stoa_proc")


def main() -> int:
    logs.configure()
    settings = site_settings.read("stoa-proc", log, Settings, check)
    if isinstance(settings, int):
        return settings
    try:
        asyncio.run(serve(settings))
    except OSError as exc:
        return site_settings.refuse("stoa-proc", log, f"cannot start: {exc}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
