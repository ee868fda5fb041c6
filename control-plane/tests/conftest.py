"""Shared fixtures for the CP tests: one embedded PostgreSQL per session, a fresh database and a real
uvicorn-served CP (in the test event loop) per module."""

from __future__ import annotations

import asyncio
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass

import httpx
import pytest
import uvicorn
from stoa_cp.app import create_app
from stoa_cp.settings import Settings
from stoa_harness.cp_client import AsyncCPClient
from stoa_harness.idp import DevIdentityProvider
from stoa_harness.postgres import EmbeddedPostgres
from stoa_harness.wait import GiveUp, wait_until_async

ADMIN_TOKEN = "test-admin-token"


def uid(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


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

    def admin(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.url, headers={"authorization": f"Bearer {ADMIN_TOKEN}"}, timeout=10
        )

    def client(self, token: str = ADMIN_TOKEN, gateway_id: str | None = None) -> AsyncCPClient:
        """The harness's CP client on this CP (the admin token unless another is given)."""
        return AsyncCPClient(self.url, token, gateway_id=gateway_id)

    def gateway(self, credential: str) -> httpx.AsyncClient:
        return self.bearer(credential)

    def bearer(self, token: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"authorization": f"Bearer {token}"}, timeout=10)

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
async def admin(cp: RunningCP) -> AsyncIterator[httpx.AsyncClient]:
    async with cp.admin() as client:
        yield client


class Api:
    """Admin-side set-up used by every test, through the harness's CP client (exposed as the `api`
    fixture: with --import-mode=importlib tests cannot import from conftest). `admin` stays the raw
    HTTP client for the tests whose subject is the raw answer."""

    def __init__(self, cp: RunningCP, admin: httpx.AsyncClient, client: AsyncCPClient) -> None:
        self.cp = cp
        self.admin = admin
        self.client = client
        self.uid = uid
        self.wait_for = wait_until_async

    async def tenant(self) -> str:
        tenant_id = uid("t")
        await self.client.create_tenant(tenant_id, "Tenant")
        return tenant_id

    async def gateway(self) -> tuple[str, str]:
        gateway_id = uid("gw")
        created = await self.client.create_gateway(gateway_id, "Gateway")
        return gateway_id, created["credential"]

    async def new_api(self, tenant_id: str, **fields: object) -> str:
        api_id = str(fields.pop("api_id", uid("api")))
        body: dict[str, object] = {"name": "API", "upstream_url": "http://127.0.0.1:9000", "methods": ["GET"]}
        body.update(fields)
        await self.client.create_api(api_id, tenant_id=tenant_id, **body)
        return api_id

    async def deploy(self, gateway_id: str, api_id: str) -> int:
        return await self.client.deploy(api_id, gateway_id)

    async def generation(self, gateway_id: str) -> int:
        return int((await self.client.gateway(gateway_id))["generation"])

    async def generations(self, *gateway_ids: str) -> list[int]:
        return [await self.generation(g) for g in gateway_ids]

    async def inventory(self, gateway_id: str, credential: str) -> dict:
        async with self.cp.client(credential) as link_view:
            return await link_view.inventory(gateway_id)


@pytest.fixture
async def api(cp: RunningCP, admin: httpx.AsyncClient) -> AsyncIterator[Api]:
    async with cp.client() as client:
        yield Api(cp, admin, client)
