"""`stoa-cp`: run the control plane with uvicorn, configured from STOA_CP_* settings."""

from __future__ import annotations

import logging
import sys

import uvicorn
from pydantic import ValidationError

from stoa_cp.app import create_app
from stoa_cp.settings import Settings


def main() -> None:
    try:
        settings = Settings()  # type: ignore[call-arg]  # read from the environment
    except ValidationError as exc:
        sys.exit(f"stoa-cp: invalid settings:\n{exc}")
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s"
    )
    # SSE streams never end by themselves: bound the graceful shutdown so a stop is prompt.
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
