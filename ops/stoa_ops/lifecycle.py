"""How a site service runs once its servers are up: stopped by SIGTERM or SIGINT, its policy-set
subscription running until then, and what it started stopped in order."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from collections.abc import Mapping

from stoa_ops.policy_sets import PolicySubscription


def stop_on_signals(stop: asyncio.Event) -> None:
    """SIGTERM and SIGINT set `stop` (where the loop can take signal handlers: the main thread)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)


async def run_until_stopped(
    stop: asyncio.Event,
    subscription: PolicySubscription,
    http: asyncio.Server,
    log: logging.Logger,
    started: Mapping[str, object],
) -> None:
    """Log `started` (its fields), follow the policy set until `stop`, then stop following it and close
    the operator endpoint `http`; the caller stops its gRPC server after."""
    ads_task = asyncio.get_running_loop().create_task(subscription.run())
    log.info("started", extra=dict(started))
    try:
        await stop.wait()
    finally:
        ads_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ads_task
        http.close()
        await http.wait_closed()
