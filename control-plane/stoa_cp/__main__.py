"""`stoa-cp`: run the control plane with uvicorn, configured from STOA_CP_* settings."""

from __future__ import annotations

import sys

import uvicorn
from pydantic import ValidationError
from stoa_ops import logs

from stoa_cp.app import create_app
from stoa_cp.permissions import SigningKeyError
from stoa_cp.settings import Settings


def main() -> None:
    try:
        settings = Settings()  # type: ignore[call-arg]  # read from the environment
    except ValidationError as exc:
        # Without the input: it would print the admin tokens and the database password.
        errors = "\n".join(
            f"  {'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}"
            for e in exc.errors(include_input=False)
        )
        sys.exit(f"stoa-cp: invalid settings:\n{errors}")
    logs.configure(settings.log_level)
    # SSE streams never end by themselves: bound the graceful shutdown so a stop is prompt.
    try:
        app = create_app(settings)
    except (SigningKeyError, OSError, ValueError) as exc:
        sys.exit(f"stoa-cp: cannot load the tool-permission signing keys: {exc}")
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        log_config=None,  # uvicorn's loggers go to the root logger: the same JSON lines as ours
        timeout_graceful_shutdown=5,
    )


if __name__ == "__main__":
    main()
