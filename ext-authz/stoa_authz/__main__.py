"""`stoa-authz`: check the settings (production refuses what cannot be enforced), load or create the
identity signing key, then run one service process or supervise WORKERS processes sharing the ports
with SO_REUSEPORT."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from stoa_ops import logs, site_settings
from stoa_translate import jwks as keysets

from stoa_authz.envelope import Envelope, write_ephemeral_key
from stoa_authz.serve import serve
from stoa_authz.settings import Settings, check

log = logging.getLogger("stoa_authz")


def _refuse(message: str) -> int:
    return site_settings.refuse("stoa-authz", log, message)


def main() -> int:
    logs.configure()
    settings = site_settings.read("stoa-authz", log, Settings, check)
    if isinstance(settings, int):
        return settings

    ephemeral: Path | None = None
    if settings.signing_key_file is None:
        # check() refused production already; elsewhere a throwaway key shared with the workers.
        ephemeral = write_ephemeral_key()
        settings.signing_key_file = ephemeral
        log.warning("STOA_AUTHZ_SIGNING_KEY_FILE not set: using an ephemeral identity signing key")
    try:
        key = keysets.read_signing_key(settings.signing_key_file)
        if settings.workers > 1:
            return _supervise(settings)
        asyncio.run(serve(settings, Envelope(key, settings.identity_issuer)))
        return 0
    except keysets.SigningKeyError as exc:
        return _refuse(str(exc))
    except OSError as exc:
        return _refuse(f"cannot start: {exc}")
    finally:
        if ephemeral is not None:
            ephemeral.unlink(missing_ok=True)


def _supervise(settings: Settings) -> int:
    """Run WORKERS copies of this command; if one dies, stop all (no silent loss of capacity)."""
    env = dict(os.environ)
    env.update(
        STOA_AUTHZ_WORKERS="1",
        STOA_AUTHZ_REUSE_PORT="true",
        STOA_AUTHZ_SIGNING_KEY_FILE=str(settings.signing_key_file),
    )
    children = [
        subprocess.Popen([sys.executable, "-m", "stoa_authz"], env=env) for _ in range(settings.workers)
    ]
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = 0
    while not stopping:
        exited = [c for c in children if c.poll() is not None]
        if exited:
            code = exited[0].returncode or 1
            log.error("worker_exited", extra={"pid": exited[0].pid, "code": code})
            break
        time.sleep(0.2)  # supervision poll, not a wait for a condition in a test
    for child in children:
        if child.poll() is None:
            child.terminate()
    for child in children:
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    return code


if __name__ == "__main__":
    sys.exit(main())
