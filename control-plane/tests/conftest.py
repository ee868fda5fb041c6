"""Shared fixtures for the CP tests: one embedded PostgreSQL per session, a fresh database and a real
uvicorn-served CP (in the test event loop) per module."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import pytest
import uvicorn
from stoa_cp.app import create_app
from stoa_cp.settings import Settings
from stoa_harness.cp_client import AsyncCPClient
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import GiveUp, wait_until_async

ADMIN_TOKEN = "test-admin-token"


@pytest.fixture(scope="session")
def pg() -> Iterator[EmbeddedPostgres]:
    with EmbeddedPostgres() as server:
        yield server


@pytest.fixture(scope="session")
def idp() -> Iterator[DevIdentityProvider]:
    """The identity provider every test CP trusts (tokens per role: `idp.role_token(...)`)."""
    with DevIdentityProvider(alg="ES256") as provider:
        yield provider


@dataclass
class RunningCP:
    url: str
    dsn: str
    settings: Settings
    server: uvicorn.Server
    task: asyncio.Task[None]

    def client(
        self, token: str | None = ADMIN_TOKEN, gateway_id: str | None = None, timeout: float = 10
    ) -> AsyncCPClient:
        """The harness's CP client on this CP: the admin token unless another is given (a principal's
        token, a gateway's credential, or None for no credential)."""
        return AsyncCPClient(self.url, token, gateway_id=gateway_id, timeout=timeout)

    async def stop(self) -> None:
        self.server.should_exit = True
        await asyncio.wait_for(self.task, timeout=15)


async def start_cp(dsn: str, **overrides: object) -> RunningCP:
    settings = Settings(database_url=dsn, admin_tokens=[ADMIN_TOKEN], **overrides)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        create_app(settings), log_level="warning", lifespan="on", timeout_graceful_shutdown=2
    )
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))

    def started() -> bool:
        if task.done():
            raise GiveUp(f"the CP stopped during start-up: {task.exception()!r}")
        return server.started

    await wait_until_async(started, 30, "the CP to start")
    return RunningCP(f"http://127.0.0.1:{port}", dsn, settings, server, task)


@pytest.fixture(scope="module")
async def cp(pg: EmbeddedPostgres, idp: DevIdentityProvider) -> AsyncIterator[RunningCP]:
    running = await start_cp(
        pg.create_database(f"cp_{uuid.uuid4().hex[:12]}"), sse_ping_s=0.5, oidc_issuers=[idp.issuer]
    )
    yield running
    await running.stop()


@pytest.fixture
async def cp_factory(pg: EmbeddedPostgres) -> AsyncIterator[Callable[..., Awaitable[RunningCP]]]:
    """Start extra CPs (fresh database unless a DSN is given) with overrides; all stopped at teardown."""
    started: list[RunningCP] = []

    async def make(dsn: str | None = None, **overrides: object) -> RunningCP:
        running = await start_cp(dsn or pg.create_database(f"cp_{uuid.uuid4().hex[:12]}"), **overrides)
        started.append(running)
        return running

    yield make
    for running in started:
        await running.stop()


@pytest.fixture
async def api(cp: RunningCP) -> AsyncIterator[AsyncCPClient]:
    """The harness's CP client with the admin token: every test's set-up, and its raw answers
    (`api.answer(...)`) where the answer itself is the subject."""
    async with cp.client() as client:
        yield client
